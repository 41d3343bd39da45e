"""Every strategy end to end on the real model and a real Triton."""

from __future__ import annotations

import json

import numpy as np
import pytest
from keyrank.config import STRATEGIES, Settings
from keyrank.strategies import REGISTRY
from keyrank.errors import InvalidRequest
from keyrank.reranker import Reranker
from shared_data import DATASETS

pytestmark = pytest.mark.triton

# Strategies with trained parts are pinned where they are trained (test_parade_trained.py); longp, which the
# 512-token model refuses, on the long-context models tests/test_longp.py builds.
CASES = [(s, None) for s in STRATEGIES
         if not REGISTRY[s].needs_selector and not REGISTRY[s].trained_parts and not REGISTRY[s].cut.needs]
CASES += [("keyb2", "bm25"), ("keyb2", "dense"), ("keyb2", "hybrid"), ("keyb2", "cross"), ("keyb2-blocks", "bm25")]


@pytest.fixture(scope="module")
def meeting():
    path = sorted((DATASETS / "qmsum" / "val").glob("*.json"))[0]
    data = json.loads(path.read_text())
    turns = [f"{t['speaker']}: {t['content']}" for t in data["meeting_transcripts"]]
    # Three ~1k-token slices of a real meeting and a short one.
    docs = ["\n".join(turns[i : i + 40]) for i in (0, 40, 80)] + ["\n".join(turns[120:123])]
    return data["specific_query_list"][0]["query"], docs


@pytest.mark.parametrize("strategy,selector", CASES)
def test_every_strategy_ranks_every_document_with_evidence_inside_it(reranker, meeting, strategy, selector):
    query, docs = meeting
    ranking = reranker.rank(query, docs, strategy=strategy, selector=selector)
    assert sorted(r.index for r in ranking.results) == list(range(len(docs)))
    scores = [r.score for r in ranking.results]
    assert scores == sorted(scores, reverse=True) and all(np.isfinite(scores))
    for result in ranking.results:
        assert result.evidence
        for ev in result.evidence:
            assert 0 <= ev.start < ev.end <= len(docs[result.index])
    ran = {"tokenize", "segment", "assemble", "infer", "aggregate"} | ({"select"} if REGISTRY[strategy].needs_selector else set())
    assert set(ranking.timings_ms) == ran | {"total"}  # a stage that did not run is absent, not 0
    assert all(ranking.timings_ms[stage] > 0 for stage in ran)
    assert ranking.timings_ms["total"] >= sum(ranking.timings_ms[stage] for stage in ran)
    assert ranking.usage.scored_sequences >= len(docs)
    if strategy == "keyb2" and selector == "cross":
        assert ranking.usage.scored_sequences > len(docs)  # blocks were scored first


def test_the_512_token_model_refuses_longp_rather_than_reading_a_prefix(reranker, meeting):
    query, docs = meeting
    with pytest.raises(InvalidRequest, match="reads at most 512 tokens") as refused:
        reranker.rank(query, docs, strategy="longp")
    assert refused.value.field == "strategy"


def test_parade_on_a_one_window_document_equals_the_plain_logit(reranker):
    # One window: max/mean of one pooled vector is that vector, and the head applied to it is the logit.
    docs = ["The Normans were descendants of Norse raiders who settled in northern France.", "Cheese is made from milk."]
    query = "who were the normans"
    plain = {r.index: r.score for r in reranker.rank(query, docs, strategy="maxp").results}
    for strategy in ("parade-max", "parade-avg"):
        parade = {r.index: r.score for r in reranker.rank(query, docs, strategy=strategy).results}
        for i in plain:
            assert parade[i] == pytest.approx(plain[i], abs=1e-4)


def test_top_n_and_max_tokens_per_doc_are_honoured_and_reported(reranker, meeting):
    query, docs = meeting
    ranking = reranker.rank(query, docs, strategy="maxp", top_n=2, max_tokens_per_doc=100)
    assert len(ranking.results) == 2
    assert ranking.usage.truncated_documents == 3  # the three long slices were cut, the short one not
    assert ranking.usage.document_tokens <= 100 * len(docs)


def test_window_cap_is_reported(prepared_models, embedded_triton, meeting):
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url, max_windows_per_doc=1)
    with Reranker(settings) as capped:
        query, docs = meeting
        ranking = capped.rank(query, docs, strategy="maxp")
    assert ranking.usage.scored_sequences == len(docs)
    assert {r.index for r in ranking.results if r.truncated} == {0, 1, 2}


@pytest.mark.parametrize(
    "kwargs,field",
    [({"strategy": "lastp"}, "strategy"), ({"strategy": "keyb2", "selector": "tfidf"}, "selector"), ({"top_n": 0}, "top_n")],
)
def test_python_api_rejects_bad_options_by_name(reranker, kwargs, field):
    with pytest.raises(InvalidRequest) as err:
        reranker.rank("q", ["d"], **kwargs)
    assert err.value.field == field


def test_a_per_request_window_cap_cuts_maxp_and_reports_it(reranker, meeting):
    query, docs = meeting
    full = reranker.rank(query, docs[:1], strategy="maxp")
    capped = reranker.rank(query, docs[:1], strategy="maxp", max_windows_per_doc=2)
    assert capped.usage.scored_sequences == 2 < full.usage.scored_sequences
    assert capped.results[0].truncated and capped.usage.truncated_documents == 1
