"""KeyB2 selection variants (docs/SELECTION.md): budget rule, lead block, neighbours, hybrid RRF, near-duplicates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keyrank.config import Settings
from keyrank.segment import Spans
from keyrank.select import REGISTRY as SELECTORS
from keyrank.select.duplicates import ChosenSets
from keyrank.segment import blocks, token_break_costs
from keyrank.select.hybrid import competition_ranks, hybrid_scores, reciprocal_rank_fusion
from keyrank.strategies.keyb2 import SelectionRules, choose_blocks, keyb2_budget, keyb2_passages, select_blocks
from keyrank.template import InputTemplate
from keyrank.tokenize import TextTokenizer
from shared_data import CE_MODEL


def token_set(ids: np.ndarray, blocks, block: int) -> np.ndarray:
    """The reference: the distinct token ids of one block, sorted (ChosenSets compares them vectorised)."""
    return np.unique(ids[blocks.starts[block] : blocks.ends[block]])


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """The reference: |a & b| / |a | b| of two sets of distinct ids; two empty sets are identical (1.0)."""
    union = np.union1d(a, b).shape[0]
    return 1.0 if union == 0 else np.intersect1d(a, b, assume_unique=True).shape[0] / union

TOKENIZER = TextTokenizer.from_file(CE_MODEL / "tokenizer.json")
BERT = InputTemplate.bert(*(TOKENIZER.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")))


def _spans(lengths) -> Spans:
    ends = np.cumsum(lengths).astype(np.int64)
    return Spans(ends - np.asarray(lengths, dtype=np.int64), ends)


def _sentences(*sentences: str) -> tuple[np.ndarray, Spans]:
    """A hand-made document, one block per sentence: its token ids and blocks."""
    encoded = TOKENIZER.encode_documents(list(sentences))
    return np.concatenate([e.ids for e in encoded]), _spans([len(e) for e in encoded])


rules_drawn = st.builds(
    SelectionRules,
    keep_lead=st.booleans(),
    neighbours=st.booleans(),
    top_share=st.sampled_from([0.1, 0.25, 0.5, 0.75, 1.0]),
    dedup_jaccard=st.sampled_from([None, 0.5, 0.8, 1.0]),
)


# --- budget rule -------------------------------------------------------------------------------


def test_fill_budget_is_480_only_for_a_29_token_query_under_a_bert_template():
    fills = {q: keyb2_budget("fill", BERT.document_budget(q), fixed=480) for q in range(1, 33)}
    assert fills[29] == 512 - 3 - 29 == 480
    assert [q for q, budget in fills.items() if budget == 480] == [29]
    assert fills[10] == 499 and fills[32] == 477


def test_paper480_budget_is_the_fixed_budget_capped_to_what_fits():
    assert keyb2_budget("paper480", BERT.document_budget(10), fixed=480) == 480
    assert keyb2_budget("paper480", BERT.document_budget(32), fixed=480) == 477
    with pytest.raises(ValueError, match="paper480"):
        keyb2_budget("papers", 500, 480)


def test_settings_default_to_the_current_plain_selection():
    rules = SelectionRules.from_settings(Settings())
    assert rules.plain and Settings().keyb2_budget == "paper480"
    assert Settings().keyb2_min_score_share == 0.5 and Settings().keyb2_block_order == "document"  # chosen on dev
    assert SelectionRules.from_settings(Settings(keyb2_keep_lead=True, keyb2_dedup_jaccard=0.8)) == SelectionRules(
        keep_lead=True, dedup_jaccard=0.8)


def test_keyb2_passages_apply_the_settings_budget_rule_and_rules_to_every_document():
    text = " ".join(f"Sentence {i} of the meeting notes talks about topic {i % 7}." for i in range(120))
    docs = TOKENIZER.encode_documents([text, text.upper()])
    pieces = [blocks(d, token_break_costs(TOKENIZER)) for d in docs]
    scores = [np.linspace(0.0, 1.0, len(sp)) for sp in pieces]  # the last blocks score best
    fits = BERT.document_budget(10)
    plain = keyb2_passages(docs, pieces, scores, fits, Settings(), selector=SELECTORS["bm25"])
    assert [p.n_tokens for p in plain] == [480, 480] and all(0 not in p.pieces for p in plain)
    filled = keyb2_passages(docs, pieces, scores, fits, Settings(keyb2_budget="fill", keyb2_keep_lead=True), selector=SELECTORS["bm25"])
    assert [p.n_tokens for p in filled] == [499, 499] and all(p.pieces[0] == 0 for p in filled)
    assert [p.doc for p in filled] == [0, 1]



def test_score_order_reads_the_same_blocks_best_first():
    pieces = [_spans([10, 10, 10, 10, 10])]
    scores = [np.array([0.1, 0.9, 0.5, 0.9, 0.0])]
    docs = TOKENIZER.encode_documents(["x " * 50])
    fill = {"keyb2_budget_tokens": 40, "keyb2_min_score_share": None}
    by_text = keyb2_passages(docs, pieces, scores, 40, Settings(**fill), selector=SELECTORS["bm25"])
    by_score = keyb2_passages(docs, pieces, scores, 40, Settings(**fill, keyb2_block_order="score"), selector=SELECTORS["bm25"])
    assert by_text[0].pieces.tolist() == [0, 1, 2, 3]
    assert by_score[0].pieces.tolist() == [1, 3, 2, 0]  # ties: the earlier block first
    assert by_score[0].starts.tolist() == [10, 30, 20, 0] and by_score[0].n_tokens == by_text[0].n_tokens



def test_min_score_share_reads_only_blocks_near_the_best_one_and_only_for_bm25():
    pieces = [_spans([10, 10, 10, 10, 10]), _spans([10, 10, 10])]
    scores = [np.array([1.0, 8.0, 3.9, 4.0, 0.0]), np.zeros(3)]  # doc 1: no query term anywhere
    docs = TOKENIZER.encode_documents(["x " * 50, "y " * 30])
    shared = Settings(keyb2_min_score_share=0.5)
    passages = keyb2_passages(docs, pieces, scores, 480, shared, selector=SELECTORS["bm25"])
    assert passages[0].pieces.tolist() == [1, 3] and passages[0].n_tokens == 20  # 3.9 < 0.5 x 8.0
    assert passages[1].pieces.tolist() == [0, 1, 2]  # nothing to compare with: the budget is filled as before
    assert keyb2_passages(docs, pieces, scores, 480, shared, selector=SELECTORS["cross"])[0].pieces.tolist() == [0, 1, 2, 3, 4]
    assert keyb2_passages(docs, pieces, scores, 480, Settings(keyb2_min_score_share=0), selector=SELECTORS["bm25"])[0].pieces.tolist() == [0, 1, 2, 3, 4]
    with_lead = keyb2_passages(docs, pieces, scores, 480, Settings(keyb2_min_score_share=0.5, keyb2_keep_lead=True), selector=SELECTORS["bm25"])
    assert with_lead[0].pieces.tolist() == [0, 1, 3]


# --- invariants over every rule combination ----------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 63), min_size=1, max_size=60), st.integers(1, 700), rules_drawn, st.data())
def test_every_rule_stays_within_budget_and_restores_document_order(lengths, budget, rules, data):
    n = len(lengths)
    scores = np.asarray(data.draw(st.lists(st.floats(-5, 5), min_size=n, max_size=n)))
    ids = np.asarray(data.draw(st.lists(st.integers(1000, 1012), min_size=sum(lengths), max_size=sum(lengths))))
    passage = choose_blocks(0, _spans(lengths), scores, budget, ids, rules)
    assert passage.n_tokens <= budget
    assert np.all(np.diff(passage.pieces) > 0) and np.all(np.diff(passage.starts) > 0)
    assert np.all(passage.ends > passage.starts)
    assert np.all(passage.starts == _spans(lengths).starts[passage.pieces])
    cut = np.flatnonzero(passage.ends - passage.starts < np.asarray(lengths)[passage.pieces])
    assert len(cut) <= 1  # at most one block is cut, and only when the budget ran out
    if len(cut):
        assert passage.n_tokens == budget
    if rules.dedup_jaccard is None:
        assert passage.n_tokens == min(budget, sum(lengths))  # the budget is spent whenever there is text
    if rules.keep_lead:
        assert passage.pieces[0] == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 63), min_size=1, max_size=60), st.integers(1, 700), st.data())
def test_plain_rules_choose_exactly_what_select_blocks_chooses(lengths, budget, data):
    scores = np.asarray(data.draw(st.lists(st.floats(-5, 5), min_size=len(lengths), max_size=len(lengths))))
    # The general path with a rule that cannot fire (dedup at 1.0 on distinct blocks) must equal the plain one.
    ids = np.arange(sum(lengths), dtype=np.int64)
    plain = select_blocks(0, _spans(lengths), scores, budget)
    general = choose_blocks(0, _spans(lengths), scores, budget, ids, SelectionRules(dedup_jaccard=1.0))
    for field in ("starts", "ends", "pieces"):
        assert getattr(general, field).tolist() == getattr(plain, field).tolist()


# --- lead block ---------------------------------------------------------------------------------


def test_lead_block_is_kept_even_when_it_scores_lowest():
    spans = _spans([20, 20, 20, 20])
    scores = np.array([-3.0, 2.0, 1.0, 0.5])
    assert 0 not in select_blocks(0, spans, scores, budget=40).pieces
    kept = choose_blocks(0, spans, scores, 40, rules=SelectionRules(keep_lead=True))
    # Lead first, then the best block; the third best no longer fits.
    assert kept.pieces.tolist() == [0, 1]


def test_a_lead_block_longer_than_the_budget_is_cut_to_it():
    kept = choose_blocks(0, _spans([50, 10]), np.array([0.0, 1.0]), 30, rules=SelectionRules(keep_lead=True))
    assert kept.pieces.tolist() == [0] and kept.ends.tolist() == [30]


# --- neighbours ---------------------------------------------------------------------------------


def test_neighbours_of_the_top_block_are_read_around_it():
    spans = _spans([10] * 10)
    scores = np.array([0.0, 0.1, 0.9, 0.0, 0.2, 5.0, 0.1, 0.0, 0.8, 0.0])
    # Plain: blocks 5, 2, 8, 4 by score.
    assert select_blocks(0, spans, scores, 40).pieces.tolist() == [2, 4, 5, 8]
    # Top blocks fill a quarter (block 5), then its neighbours 4 and 6, then the next best (2).
    chosen = choose_blocks(0, spans, scores, 40, rules=SelectionRules(neighbours=True, top_share=0.25))
    assert chosen.pieces.tolist() == [2, 4, 5, 6]


def test_neighbours_are_added_in_score_order_of_the_top_blocks():
    spans = _spans([10] * 10)
    scores = np.array([0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0])
    # Top blocks 7 then 2 (20 of 50 tokens); room for three neighbours: 6, 8 (of 7) then 1 (of 2), not 3.
    chosen = choose_blocks(0, spans, scores, 50, rules=SelectionRules(neighbours=True, top_share=0.4))
    assert chosen.pieces.tolist() == [1, 2, 6, 7, 8]
    assert chosen.n_tokens == 50


def test_a_neighbour_that_does_not_fit_whole_is_not_added():
    spans = _spans([10, 40, 10, 10, 10])
    scores = np.array([0.0, 0.0, 5.0, 0.0, 1.0])
    # Block 2 is the top block; its neighbour 1 (40 tokens) would overrun the 30 left and is not cut to fit;
    # neighbour 3 fits, then the budget goes by score (4, then 0).
    chosen = choose_blocks(0, spans, scores, 40, rules=SelectionRules(neighbours=True, top_share=0.25))
    assert chosen.pieces.tolist() == [0, 2, 3, 4]
    assert (chosen.ends - chosen.starts).tolist() == [10, 10, 10, 10]


# --- hybrid -------------------------------------------------------------------------------------


def test_competition_ranks_share_the_best_rank_on_ties():
    assert competition_ranks(np.array([3.0, 1.0, 3.0, 0.0, 1.0])).tolist() == [1, 3, 1, 5, 3]


def test_hybrid_scores_are_reciprocal_rank_fusion_of_bm25_and_dense():
    bm25 = np.array([2.5, 0.0, 7.1, 0.0, 1.2])
    dense = np.array([0.31, 0.62, 0.12, 0.05, 0.40])
    # Ranks by hand: bm25 2,4,1,4,3 (the two zeros share rank 4); dense 3,1,4,5,2.
    bm25_ranks, dense_ranks = np.array([2, 4, 1, 4, 3]), np.array([3, 1, 4, 5, 2])
    expected = 1 / (60 + bm25_ranks) + 1 / (60 + dense_ranks)
    fused = reciprocal_rank_fusion(bm25, dense)
    np.testing.assert_allclose(fused, expected)
    np.testing.assert_allclose(reciprocal_rank_fusion(bm25, dense, k=0), 1 / bm25_ranks + 1 / dense_ranks)
    # The blocks keyb2 reads under the hybrid selector are the fused ranking's best.
    passage = choose_blocks(0, _spans([10] * 5), fused, 20)
    assert set(passage.pieces.tolist()) == set(np.argsort(-expected, kind="stable")[:2].tolist())


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=40), st.integers(0, 100))
def test_hybrid_ranks_equal_fused_ranks_of_a_reference_rrf(pairs, k):
    bm25 = np.array([float(a) for a, _ in pairs])
    dense = np.array([float(b) for _, b in pairs])

    def reference_rank(values, i):
        return 1 + sum(v > values[i] for v in values)

    reference = [1 / (k + reference_rank(bm25, i)) + 1 / (k + reference_rank(dense, i)) for i in range(len(pairs))]
    fused = reciprocal_rank_fusion(bm25, dense, k=k)
    np.testing.assert_allclose(fused, reference)
    assert np.argsort(-fused, kind="stable").tolist() == np.argsort(-np.asarray(reference), kind="stable").tolist()


def test_hybrid_refuses_score_arrays_of_different_blocks():
    with pytest.raises(ValueError, match="same blocks"):
        reciprocal_rank_fusion(np.zeros(3), np.zeros(4))


def test_hybrid_scores_fuse_each_document_separately():
    lexical = [np.array([1.0, 0.0]), np.array([0.0, 2.0, 1.0])]
    dense = [np.array([0.1, 0.9]), np.array([0.3, 0.2, 0.1])]
    fused = hybrid_scores(lexical, dense, k=60)
    np.testing.assert_allclose(fused[0], [1 / 61 + 1 / 62, 1 / 62 + 1 / 61])
    np.testing.assert_allclose(fused[1], [1 / 63 + 1 / 61, 1 / 61 + 1 / 62, 1 / 62 + 1 / 63])
    with pytest.raises(ValueError, match="documents"):
        hybrid_scores(lexical, dense[:1])


# --- near-duplicates ----------------------------------------------------------------------------


def test_a_repeated_block_is_dropped_and_its_budget_goes_to_new_text():
    ids, spans = _sentences(
        "The committee opened with apologies.",
        "We agreed the remote control budget is twelve euros fifty.",
        "Lunch was served at noon in the main hall.",
        "We agreed the remote control budget is twelve euros fifty.",
        "The remote needs a budget for the speech recognition chip.",
    )
    scores = np.array([0.0, 5.0, 0.1, 5.0, 3.0])
    budget = int(spans.lengths[1] + spans.lengths[4])
    assert select_blocks(0, spans, scores, budget).pieces.tolist() == [1, 3]  # the copy wastes half the budget
    deduped = choose_blocks(0, spans, scores, budget, ids, SelectionRules(dedup_jaccard=0.8))
    assert deduped.pieces.tolist() == [1, 4] and deduped.n_tokens == budget


def test_a_near_duplicate_counts_by_jaccard_of_token_sets():
    ids, spans = _sentences(
        "We agreed the remote control budget is twelve euros fifty.",
        "so we agreed the remote control budget is twelve euros fifty.",
        "The remote control budget was never agreed by marketing.",
    )
    near = jaccard(token_set(ids, spans, 0), token_set(ids, spans, 1))
    far = jaccard(token_set(ids, spans, 0), token_set(ids, spans, 2))
    assert near >= 0.8 > far
    chosen = ChosenSets(ids, spans, threshold=0.8)
    chosen.add(0)
    assert chosen.repeats(1) and not chosen.repeats(2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 8), min_size=1, max_size=10), min_size=2, max_size=8),
       st.sampled_from([0.3, 0.5, 0.8, 1.0]))
def test_chosen_sets_flag_a_candidate_exactly_when_python_sets_do(blocks_tokens, threshold):
    ids = np.concatenate([np.asarray(b, dtype=np.int64) for b in blocks_tokens])
    spans = _spans([len(b) for b in blocks_tokens])
    chosen = ChosenSets(ids, spans, threshold)
    for block in range(len(blocks_tokens) - 1):
        chosen.add(block)
    candidate = set(blocks_tokens[-1])
    expected = any(len(candidate & set(b)) / len(candidate | set(b)) >= threshold for b in blocks_tokens[:-1])
    assert chosen.repeats(len(blocks_tokens) - 1) == expected


def test_dedup_needs_the_documents_token_ids():
    with pytest.raises(ValueError, match="token ids"):
        choose_blocks(0, _spans([5, 5]), np.zeros(2), 10, rules=SelectionRules(dedup_jaccard=0.8))
