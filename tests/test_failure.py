"""Triton dies while the gateway runs: fast 503s, never a hang; recovery when it is back."""

from __future__ import annotations

import time

import httpx
import pytest

pytestmark = pytest.mark.triton

BODY = {"query": "who makes cheese", "documents": ["The farm makes cheese from milk.", "Cars are fast."]}


def test_triton_killed_gives_503_within_a_second_then_recovers(gateway_url, embedded_triton):
    with httpx.Client(base_url=gateway_url, timeout=10) as http:
        assert http.post("/rerank", json=BODY).status_code == 200
        assert http.get("/readyz").status_code == 200

        embedded_triton.kill()
        try:
            for path, method in (("/readyz", "GET"), ("/rerank", "POST"), ("/rerank", "POST")):
                t0 = time.monotonic()
                response = http.request(method, path, json=BODY if method == "POST" else None)
                elapsed = time.monotonic() - t0
                assert response.status_code == 503, (path, response.text)
                assert response.headers.get("retry-after")
                assert elapsed < 1.0, (path, elapsed)
        finally:
            embedded_triton.restart()

        deadline = time.monotonic() + 30
        while http.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "gateway never saw Triton come back"
            time.sleep(0.2)
        response = http.post("/rerank", json=BODY)
        assert response.status_code == 200
        assert response.json()["results"][0]["index"] == 0
