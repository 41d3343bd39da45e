"""keyb2 read in up to three passes, and fused with its selector's evidence."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keyrank.aggregate import fused_with_selector
from keyrank.config import Settings
from keyrank.segment import Spans
from keyrank.select import REGISTRY as SELECTORS
from keyrank.strategies.keyb2 import SelectionRules, choose_blocks, keyb2_passages, reading_passes
from keyrank.tokenize import TextTokenizer
from pydantic import ValidationError
from shared_data import CE_MODEL

TOKENIZER = TextTokenizer.from_file(CE_MODEL / "tokenizer.json")


def _spans(lengths) -> Spans:
    ends = np.cumsum(lengths).astype(np.int64)
    return Spans(ends - np.asarray(lengths, dtype=np.int64), ends)


rules_drawn = st.builds(
    SelectionRules,
    keep_lead=st.booleans(),
    neighbours=st.booleans(),
    top_share=st.sampled_from([0.25, 0.5, 1.0]),
    dedup_jaccard=st.sampled_from([None, 0.8]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 63), min_size=1, max_size=60), st.integers(1, 400), rules_drawn, st.integers(1, 3), st.data())
def test_passes_read_disjoint_blocks_each_within_budget_the_first_as_one_pass_did(lengths, budget, rules, passes, data):
    n = len(lengths)
    scores = np.asarray(data.draw(st.lists(st.floats(-5, 5), min_size=n, max_size=n)))
    ids = np.asarray(data.draw(st.lists(st.integers(1000, 1012), min_size=sum(lengths), max_size=sum(lengths))))
    spans = _spans(lengths)
    read = reading_passes(0, spans, scores, budget, ids, rules, passes)
    assert 1 <= len(read) <= passes
    first = choose_blocks(0, spans, scores, budget, ids, rules)
    assert read[0].pieces.tolist() == first.pieces.tolist() and read[0].ends.tolist() == first.ends.tolist()
    chosen = np.concatenate([p.pieces for p in read])
    assert len(np.unique(chosen)) == len(chosen)  # no block is read twice
    for p in read:
        assert 0 < p.n_tokens <= budget or (p is read[0] and p.n_tokens == 0)
        assert np.all(np.diff(p.pieces) > 0)  # document order within a pass
    if len(read) < passes and rules.dedup_jaccard is None:
        assert len(chosen) == n  # stopped early only because every block was read


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 63), min_size=1, max_size=60), st.integers(1, 400), st.data())
def test_plain_passes_read_the_blocks_in_score_order(lengths, budget, data):
    n = len(lengths)
    scores = np.asarray(data.draw(st.lists(st.floats(-5, 5), min_size=n, max_size=n, unique=True)))
    read = reading_passes(0, _spans(lengths), scores, budget, None, SelectionRules(), 3)
    for earlier, later in zip(read, read[1:]):
        assert scores[later.pieces].max() < scores[earlier.pieces].min()


def test_a_later_pass_reads_only_blocks_left_above_the_score_share():
    docs = TOKENIZER.encode_documents(["x " * 50])
    pieces = [_spans([10, 10, 10, 10, 10])]
    scores = [np.array([1.0, 8.0, 3.9, 4.0, 6.0])]
    one = Settings(keyb2_budget_tokens=10, keyb2_min_score_share=0.5)
    passages = keyb2_passages(docs, pieces, scores, 480, one.with_overrides(keyb2_passes=3), selector=SELECTORS["bm25"])
    assert [p.pieces.tolist() for p in passages] == [[1], [4], [3]]  # 3.9 < 0.5 x 8 is never read
    two = keyb2_passages(docs, pieces, [np.array([0.0, 8.0, 0.0, 0.0, 0.0])], 480,
                         one.with_overrides(keyb2_passes=3), selector=SELECTORS["bm25"])
    assert [p.pieces.tolist() for p in two] == [[1]]  # one on-topic block: one pass, whatever is allowed
    plain = keyb2_passages(docs, pieces, scores, 480, one, selector=SELECTORS["bm25"])
    assert [p.pieces.tolist() for p in plain] == [[1]]


def test_the_lead_block_is_read_once_in_the_first_pass():
    spans = _spans([10, 10, 10, 10])
    read = reading_passes(0, spans, np.array([0.0, 1.0, 3.0, 2.0]), 20, None, SelectionRules(keep_lead=True), 3)
    assert [p.pieces.tolist() for p in read] == [[0, 2], [1, 3]]


def test_passes_and_fusion_weight_are_bounded_settings():
    assert Settings().keyb2_passes == 1 and Settings().keyb2_fusion_weight == 0.0  # the papers' one reading, no fusion
    for bad in ({"keyb2_passes": 0}, {"keyb2_passes": 4}, {"keyb2_fusion_weight": -0.1}):
        with pytest.raises(ValidationError):
            Settings(**bad)
    with pytest.raises(ValueError, match="1 to 3"):
        reading_passes(0, _spans([5]), np.zeros(1), 10, None, SelectionRules(), 0)


# --- fusion with the selector's evidence --------------------------------------------------------


def test_fusion_adds_the_weighted_z_score_of_each_documents_best_block():
    scores = np.array([1.0, 1.0, 0.5])
    blocks = [np.array([0.0, 3.0]), np.array([1.0]), np.array([2.0, -1.0])]  # best: 3, 1, 2
    fused = fused_with_selector(scores, blocks, 0.5)
    best = np.array([3.0, 1.0, 2.0])
    np.testing.assert_allclose(fused, scores + 0.5 * (best - best.mean()) / best.std())
    assert fused[0] > fused[1]  # the same model score, the better selector evidence first


def test_fusion_off_or_without_spread_leaves_scores_alone():
    scores = np.array([0.2, 0.1])
    blocks = [np.array([2.0]), np.array([1.0])]
    assert fused_with_selector(scores, blocks, 0.0).tolist() == scores.tolist()
    assert fused_with_selector(scores, [np.array([1.0]), np.array([1.0])], 2.0).tolist() == scores.tolist()
    assert fused_with_selector(scores[:1], blocks[:1], 2.0).tolist() == [0.2]  # one document: nothing to normalise by


def test_a_document_without_blocks_gets_the_mean():
    fused = fused_with_selector(np.zeros(3), [np.array([4.0]), np.zeros(0), np.array([2.0])], 1.0)
    assert fused.tolist() == [1.0, 0.0, -1.0]
