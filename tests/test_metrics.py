"""/metrics counts what a request did: values move by what the response reports,
not merely "the metric's name is on the page" (prometheus prints HELP/TYPE lines
for metrics nothing ever touched)."""

from __future__ import annotations

import httpx
import pytest
from live_gateway import metric_samples

pytestmark = pytest.mark.triton


def _delta(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_one_keyb2_request_moves_every_metric_by_what_it_did(gateway_url):
    docs = ["The budget was agreed on Tuesday by the finance committee.", "Cats sleep most of the day.",
            "The remote control design meeting discussed buttons. " * 40]
    before = metric_samples(gateway_url)
    response = httpx.post(f"{gateway_url}/rerank", timeout=60,
                          json={"query": "when was the budget agreed", "documents": docs, "strategy": "keyb2", "selector": "bm25"})
    assert response.status_code == 200
    body = response.json()
    after = metric_samples(gateway_url)

    assert _delta(before, after, "keyrank_requests_total", endpoint="/rerank", strategy="keyb2", outcome="ok", model=body["model"]) == 1
    for stage in ("tokenize", "segment", "select", "assemble", "infer", "aggregate", "total"):
        assert _delta(before, after, "keyrank_stage_seconds_count", stage=stage) == 1, stage
        assert _delta(before, after, "keyrank_stage_seconds_sum", stage=stage) > 0, stage
    assert _delta(before, after, "keyrank_scored_tokens_sum") == body["usage"]["scored_tokens"]
    assert _delta(before, after, "keyrank_request_document_tokens_sum") == body["usage"]["document_tokens"]
    assert _delta(before, after, "keyrank_request_documents_sum") == len(docs)
    selected_blocks = sum(len(r["evidence"]) for r in body["results"])
    assert _delta(before, after, "keyrank_evidence_block_position_count", strategy="keyb2") == selected_blocks
    triton_rtts = sum(v for (name, _), v in after.items() if name == "keyrank_triton_rtt_seconds_count") - sum(
        v for (name, _), v in before.items() if name == "keyrank_triton_rtt_seconds_count")
    assert triton_rtts >= 1


def test_a_strategy_without_a_selector_records_no_select_stage(gateway_url):
    before = metric_samples(gateway_url)
    response = httpx.post(f"{gateway_url}/rerank", timeout=60,
                          json={"query": "cats", "documents": ["Cats sleep most of the day."], "strategy": "firstp"})
    assert response.status_code == 200
    after = metric_samples(gateway_url)
    assert _delta(before, after, "keyrank_stage_seconds_count", stage="infer") == 1
    assert _delta(before, after, "keyrank_stage_seconds_count", stage="select") == 0
    assert "select" not in response.json()["timings_ms"] or response.json()["timings_ms"]["select"] is None
