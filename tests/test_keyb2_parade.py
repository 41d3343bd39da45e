"""keyb2-parade-avg / keyb2-parade-max: keyb2's passes folded like PARADE's windows, served through the real
pipeline on the prepared model: the document score is the classifier head on the mean (max) of the pooled
vectors of exactly the passes keyb2 reads with ``keyb2_passes`` = 2 (the rows' fewest) or more."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from keyrank.aggregate import ClassifierHead
from keyrank.pipeline import Pipeline, RerankOptions
from keyrank.reranker import Reranker
from keyrank.resolved import resolve
from keyrank.strategies import REGISTRY
from keyrank.strategies.cuts import BLOCKS
from shared_data import DATASETS

FOLDS = {"keyb2-parade-avg": np.mean, "keyb2-parade-max": np.max}


def test_the_rows_are_keyb2s_cut_with_parades_folds():
    for name, aggregation in (("keyb2-parade-avg", "parade-avg"), ("keyb2-parade-max", "parade-max")):
        spec = REGISTRY[name]
        assert (spec.cut, spec.aggregation, spec.needs_pooled, spec.least_passes) == (BLOCKS, aggregation, True, 2)
        assert spec.needs_selector and not spec.trained_parts
    assert REGISTRY["keyb2"].least_passes == 1


@pytest.fixture(scope="module")
def meeting():
    path = sorted((DATASETS / "qmsum" / "val").glob("*.json"))[0]
    data = json.loads(path.read_text())
    turns = [f"{t['speaker']}: {t['content']}" for t in data["meeting_transcripts"]]
    # Two ~1k-token slices (two passes or more each) and a short one (one pass: nothing left for a second).
    docs = ["\n".join(turns[i : i + 40]) for i in (0, 40)] + ["\n".join(turns[120:123])]
    return data["specific_query_list"][0]["query"], docs


@pytest.fixture(scope="module")
def local(prepared_models):
    # No score share: every block is left for later passes, so each long slice fills two.
    with Reranker.local(prepared_models, threads=2, keyb2_min_score_share=None) as reranker:
        yield reranker


def test_the_rows_read_at_least_two_passes_and_keyb2_passes_raises_it(local):
    pipeline = local.pipeline
    assert pipeline.settings.keyb2_passes == 1
    assert pipeline.resolve(RerankOptions(strategy="keyb2")).settings.keyb2_passes == 1
    assert pipeline.resolve(RerankOptions(strategy="keyb2-parade-avg")).settings.keyb2_passes == 2
    three = pipeline.settings.with_overrides(keyb2_passes=3)
    assert resolve(RerankOptions(strategy="keyb2-parade-max"), three, pipeline.template,
                   pipeline.gateway_dir).settings.keyb2_passes == 3


@pytest.mark.parametrize(("strategy", "passes"), [("keyb2-parade-avg", 2), ("keyb2-parade-max", 3)])
def test_served_score_is_the_head_on_the_folded_pooled_vectors_of_keyb2s_passes(local, meeting, strategy, passes):
    query, docs = meeting
    pipeline = local.pipeline
    settings = pipeline.settings.with_overrides(keyb2_passes=passes)
    if passes == 2:
        served = local.rank(query, docs, strategy=strategy, selector="bm25")  # the rows' own fewest passes
    else:
        raised = Pipeline(local.tokenizer, local.template, settings, gateway_dir=pipeline.gateway_dir,
                          manifest=pipeline.manifest)
        other = Reranker(settings, scorer=local.scorer, pipeline=raised)
        other.head = local.head
        served = other.rank(query, docs, strategy=strategy, selector="bm25")
    # keyb2's own passes under the same number of them: what the row must read.
    keyb2 = replace(pipeline.resolve(RerankOptions(strategy="keyb2", selector="bm25")), settings=settings)
    plan = pipeline.plan(query, docs, keyb2)
    counts = np.bincount(plan.doc_of, minlength=len(docs))
    assert counts[:2].min() >= 2 and counts[2] == 1 and counts.max() <= passes
    assert served.usage.scored_sequences == len(plan.passages)
    pooled = local.scorer.score_sync(plan.inputs, want_pooled=True).pooled.astype(np.float64)
    head: ClassifierHead = local.head
    expected = [float(head(FOLDS[strategy](pooled[plan.doc_of == d], axis=0)[None])[0]) for d in range(len(docs))]
    scores = {r.index: r.score for r in served.results}
    np.testing.assert_allclose([scores[d] for d in range(len(docs))], expected, atol=1e-4)
    assert all(r.evidence for r in served.results)
