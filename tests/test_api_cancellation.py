"""Clients that go away cost nothing more: their work is cancelled at the next stage boundary,
their Triton calls with it, and they are counted as client_closed, never as an outage.

Real HTTP (httpx) against the session's gateway and Triton: nothing is mocked.
"""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest
from prometheus_client import REGISTRY

pytestmark = pytest.mark.triton

WORDS = ("the", "farm", "makes", "cheese", "from", "milk", "while", "rivers", "carry", "boats", "past", "old", "mills")
WELL_BEHAVED = {"query": "who makes cheese", "documents": ["The farm makes cheese from milk.", "Cars are fast."]}


def _long_document(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def _counted(outcome: str, strategy: str = "maxp") -> float:
    labels = {"endpoint": "/rerank", "strategy": strategy, "outcome": outcome}
    # summed over the model label (one model here)
    return sum(s.value for family in REGISTRY.collect() if family.name == "keyrank_requests" for s in family.samples
               if s.name == "keyrank_requests_total" and labels.items() <= s.labels.items())


def _impatient_client(url: str, stop: threading.Event, seed: int, sent: list[int]) -> None:
    """Sends a costly request (about 10 windows of 512 tokens: seconds of CPU) and hangs up after 0.2 s."""
    body = {"query": "cheese", "documents": [_long_document(2_000, seed)], "strategy": "maxp"}
    while not stop.is_set():
        with httpx.Client(base_url=url, timeout=0.2) as http:
            try:
                http.post("/rerank", json=body)
            except httpx.TimeoutException:
                sent[0] += 1


def test_clients_that_hang_up_after_200ms_cannot_starve_a_well_behaved_one(gateway_url):
    with httpx.Client(base_url=gateway_url, timeout=30) as http:
        assert http.post("/rerank", json=WELL_BEHAVED).status_code == 200  # warm
        closed_before, unavailable_before = _counted("client_closed"), _counted("unavailable")
        stop = threading.Event()
        sent = [0]
        impatient = [threading.Thread(target=_impatient_client, args=(gateway_url, stop, i, sent)) for i in range(4)]
        for thread in impatient:
            thread.start()
        try:
            time.sleep(1.0)  # let them pile up first
            answers = []
            for _ in range(4):
                # Well behaved: a 429 is honoured (Retry-After) and retried; starving means never getting a 200.
                started = time.monotonic()
                response = http.post("/rerank", json=WELL_BEHAVED)
                while response.status_code == 429 and time.monotonic() - started < 10:
                    time.sleep(min(float(response.headers["retry-after"]), 2.0))
                    response = http.post("/rerank", json=WELL_BEHAVED)
                answers.append((response.status_code, round(time.monotonic() - started, 2)))
        finally:
            stop.set()
            for thread in impatient:
                thread.join(timeout=10)
    assert [status for status, _ in answers] == [200] * 4, answers
    assert all(seconds < 10 for _, seconds in answers), answers
    assert sent[0] >= 8, "the impatient clients hardly sent anything: the test proves nothing"
    deadline = time.monotonic() + 10  # the last hang-ups are counted once the gateway notices them
    while _counted("client_closed") - closed_before < sent[0] - 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _counted("client_closed") - closed_before >= sent[0] - 4
    assert _counted("unavailable") == unavailable_before, "abandoned requests were counted as an outage"
