"""Past the per-document window cap: the best windows by BM25 (the default) or the first ones.

The CPU stages only (``Pipeline.plan``): which windows are read is decided before the model runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from keyrank.config import Settings
from keyrank.pipeline import Pipeline, StageTimer
from keyrank.resolved import RerankOptions

FILLER = " ".join(f"Item {i} of the inventory was counted twice and filed with the quarterly report." for i in range(160))
NEEDLE = "The harbour lighthouse keeper repaired the lighthouse lamp before the storm."
QUERY = "who repaired the lighthouse lamp"


@pytest.fixture(scope="module")
def pipelines(prepared_models: Path) -> dict[str, Pipeline]:
    return {by: Pipeline.from_model_dir(Settings(model_dir=prepared_models, document_cache_bytes=0, window_cap_by=by))
            for by in ("bm25", "first")}


def _read(plan, doc: str) -> list[str]:
    """The text of each passage of document 0, from its token ranges."""
    enc = plan.docs[0]
    return [doc[int(enc.offsets[a, 0]) : int(enc.offsets[b - 1, 1])] for p in plan.passages if p.doc == 0
            for a, b in zip(p.starts.tolist(), p.ends.tolist())]


@pytest.mark.parametrize("strategy", ["maxp", "avgp", "parade-avg"])
def test_a_capped_document_keeps_the_window_that_matches_the_query(pipelines, strategy):
    doc = FILLER + " " + NEEDLE + " " + FILLER[:400]
    timer = StageTimer()
    plan = pipelines["bm25"].plan(QUERY, [doc], RerankOptions(strategy=strategy, max_windows_per_doc=1), timer=timer)
    read = _read(plan, doc)
    assert len(read) == 1 and NEEDLE in read[0]
    assert plan.truncated == [True]
    assert "select" in timer.total()  # the windows were scored (BM25), and the time is reported
    first = pipelines["first"].plan(QUERY, [doc], RerankOptions(strategy=strategy, max_windows_per_doc=1))
    assert len(_read(first, doc)) == 1 and NEEDLE not in _read(first, doc)[0] and first.truncated == [True]


def test_the_kept_windows_stay_in_document_order(pipelines):
    doc = NEEDLE + " " + FILLER + " " + NEEDLE.replace("lamp", "lamp again")
    plan = pipelines["bm25"].plan(QUERY, [doc], RerankOptions(strategy="maxp", max_windows_per_doc=2))
    starts = [int(p.starts[0]) for p in plan.passages]
    assert len(starts) == 2 and starts == sorted(starts) and starts[0] == 0  # the lead and the last window
    assert NEEDLE.replace("lamp", "lamp again") in _read(plan, doc)[1]


def test_under_the_cap_both_read_every_window_and_nothing_is_scored(pipelines):
    doc = FILLER + " " + NEEDLE
    plans = {}
    for by, pipeline in pipelines.items():
        timer = StageTimer()
        plans[by] = pipeline.plan(QUERY, [doc, NEEDLE], RerankOptions(strategy="maxp"), timer=timer)
        assert "select" not in timer.total()
    assert [(p.starts.tolist(), p.ends.tolist()) for p in plans["bm25"].passages] == \
        [(p.starts.tolist(), p.ends.tolist()) for p in plans["first"].passages]
    assert plans["bm25"].truncated == [False, False]


def test_keyb2_is_not_capped_by_windows(pipelines):
    doc = FILLER + " " + NEEDLE
    a = pipelines["bm25"].plan(QUERY, [doc], RerankOptions(strategy="keyb2", selector="bm25", max_windows_per_doc=1))
    b = pipelines["first"].plan(QUERY, [doc], RerankOptions(strategy="keyb2", selector="bm25", max_windows_per_doc=1))
    assert [p.starts.tolist() for p in a.passages] == [p.starts.tolist() for p in b.passages]


def test_which_windows_a_capped_document_keeps_is_decided_once_by_resolve(pipelines):
    from keyrank.select import REGISTRY as SELECTORS

    assert pipelines["bm25"].resolve(RerankOptions(strategy="maxp")).window_picker is SELECTORS["bm25"]
    assert pipelines["first"].resolve(RerankOptions(strategy="maxp")).window_picker is None  # the first ones, cut at once
    for strategy in ("firstp", "keyb2", "keyb2-blocks"):  # nothing windowed, nothing to pick
        assert pipelines["bm25"].resolve(RerankOptions(strategy=strategy)).window_picker is None
