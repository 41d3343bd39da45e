"""Abusive clients cost the gateway little and still get a JSON answer: 8,000 unknown fields are refused at
once in a bounded answer.
"""

from __future__ import annotations

import time

from fastapi.testclient import TestClient
from keyrank.api import create_app
from keyrank.config import Settings

DEAD_TRITON = "127.0.0.1:1"
KEY = "s3cret"


def _settings(model_dir, **extra) -> Settings:
    return Settings(model_dir=model_dir, triton_url=DEAD_TRITON, **extra)


# --------------------------------------------------------------------------- unknown fields


def test_8000_unknown_fields_get_a_422_at_once_in_a_bounded_answer(tmp_path):
    client = TestClient(create_app(_settings(tmp_path)))  # refused before any model is needed
    body = {"query": "q", "documents": ["a"], **{f"field{i:05d}": 1 for i in range(8_000)}}
    started = time.monotonic()
    response = client.post("/rerank", json=body)
    took = time.monotonic() - started
    assert response.status_code == 422
    assert took < 1.0, f"{took:.1f} s"  # was 15 s, the event loop held all along
    assert len(response.content) < 4_000  # was 551 KB for a 95 KB body
    error = response.json()["error"]
    assert error["message"].startswith("field00000: unknown field; field00001: unknown field")
    assert len(error["details"]) == 20 and error["details_omitted"] == 7_980


def test_an_unknown_field_name_of_any_length_is_echoed_cut(tmp_path):
    client = TestClient(create_app(_settings(tmp_path)))
    response = client.post("/rerank", json={"query": "q", "documents": ["a"], "x" * 100_000: 1})
    assert response.status_code == 422 and len(response.content) < 1_000
    assert response.json()["error"]["field"] == "x" * 125 + "..."
