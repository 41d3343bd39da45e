"""CogLTX blocks and sliding windows, as views on the token arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keyrank.segment import FORCED_COST, Spans, best_pieces, blocks, break_costs, cheapest_cut, token_break_costs, windows
from keyrank.tokenize import TextTokenizer
from shared_data import CE_MODEL

TOKENIZER = TextTokenizer.from_file(CE_MODEL / "tokenizer.json")
COSTS = token_break_costs(TOKENIZER)

words = st.text(alphabet="abcdefghij", min_size=1, max_size=8)
sentence = st.lists(words, min_size=1, max_size=40).map(" ".join)
punct = st.sampled_from([". ", "? ", "! ", ", ", " ", "\n", "; ", " - "])
REAL_WORDS = ["the", "meeting", "decided", "to", "move", "the", "budget", "review", "to", "next", "week", "after", "the", "remote", "control", "design"]
documents = st.lists(st.tuples(sentence, punct), min_size=0, max_size=30).map(lambda parts: "".join(s + p for s, p in parts))


def _blocks(text: str, max_tokens: int = 63):
    doc = TOKENIZER.encode_documents([text])[0]
    return doc, blocks(doc, COSTS, max_tokens)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents, st.sampled_from([8, 17, 63]))
def test_blocks_cover_the_document_exactly_once_and_never_exceed_the_limit(text, max_tokens):
    doc, spans = _blocks(text, max_tokens)
    if len(doc) == 0:
        assert len(spans) == 0
        return
    assert spans.starts[0] == 0 and spans.ends[-1] == len(doc)
    assert np.array_equal(spans.starts[1:], spans.ends[:-1])  # contiguous, no overlap, no gap
    assert np.all(spans.lengths >= 1) and np.all(spans.lengths <= max_tokens)


@settings(max_examples=60, deadline=None)
@given(documents)
def test_block_character_offsets_slice_back_to_the_original_text(text):
    doc, spans = _blocks(text)
    for a, b in zip(spans.starts, spans.ends):
        start, end = doc.char_span(int(a), int(b))
        piece = text[start:end]
        # The alphabet here is unchanged by BERT's normaliser, so a block's text is exactly its
        # tokens' surface (a forced break may fall between word pieces: "aa" | "##b").
        surface = "".join(TOKENIZER.id_to_token(int(t)).removeprefix("##") for t in doc.ids[a:b])
        assert "".join(piece.split()) == surface
        assert piece == piece.strip()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(REAL_WORDS), min_size=2, max_size=40).map(" ".join), min_size=1, max_size=30))
def test_breaks_land_on_sentence_ends_when_sentences_fit_in_a_block(sentences):
    text = ". ".join(sentences) + "."
    doc, spans = _blocks(text)
    assert all(len(TOKENIZER.encode_documents([s + "."])[0]) <= 63 for s in sentences)
    costs = break_costs(doc, COSTS)
    # Every sentence here is under 63 tokens, so no block needs a forced break.
    assert np.all(costs[spans.ends - 1] < FORCED_COST)


def _cheapest_cut_by_scanning(costs: np.ndarray, max_tokens: int, block_cost: float) -> np.ndarray:
    """The DP as CogLTX states it: every start in range scanned for each end, the earliest cheapest kept."""
    n = len(costs)
    best, start = [0.0] + [0.0] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        lo = max(0, j - max_tokens)
        arg = min(range(lo, j), key=lambda i: (best[i], i))
        best[j], start[j] = best[arg] + costs[j - 1] + block_cost, arg
    starts, j = [], n
    while j > 0:
        j = start[j]
        starts.append(j)
    return np.asarray(starts[::-1], dtype=np.int64)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0, 2.0, FORCED_COST]), max_size=300), st.sampled_from([1, 2, 5, 17, 63]),
       st.sampled_from([0.0, 1.0, 0.5]))
def test_the_linear_dp_cuts_where_scanning_every_start_does(costs, max_tokens, block_cost):
    """Many ties (four cost values): the sliding minimum must keep the earliest start, as the scan does."""
    costs = np.asarray(costs, dtype=np.float64)
    if costs.size:
        costs[-1] = 0.0
    assert np.array_equal(cheapest_cut(costs, max_tokens, block_cost), _cheapest_cut_by_scanning(costs, max_tokens, block_cost))


def test_a_newline_is_the_cheapest_break():
    text = "alpha beta gamma, delta epsilon\nzeta eta theta. iota kappa"
    doc = TOKENIZER.encode_documents([text])[0]
    costs = break_costs(doc, COSTS)
    tokens = [TOKENIZER.id_to_token(int(i)) for i in doc.ids]
    assert costs[tokens.index("epsilon")] == 0.0
    assert costs[tokens.index(".")] == 1.0
    assert costs[tokens.index(",")] == 2.0
    assert costs[tokens.index("alpha")] == FORCED_COST
    assert costs[-1] == 0.0


def test_long_unpunctuated_text_is_cut_by_forced_breaks_at_the_limit():
    doc, spans = _blocks(" ".join(["word"] * 200))
    # The fewest blocks (a per-block cost discourages needless short ones), all at the limit but one; among
    # cuts of equal cost the DP keeps the last one it finds, which leaves the short block first.
    assert spans.lengths.tolist() == [11, 63, 63, 63]


def test_blocks_prefer_sentence_ends_over_forced_breaks():
    first = " ".join(["alpha"] * 40) + "."
    second = " ".join(["beta"] * 40) + "."
    doc, spans = _blocks(first + " " + second)
    assert spans.ends[0] == 41  # right after the first period, not at token 63


@given(st.integers(0, 5000), st.integers(1, 600), st.data())
def test_windows_cover_every_token_with_the_requested_stride(n, size, data):
    stride = data.draw(st.integers(1, size))
    spans = windows(n, size, stride, max_windows=10_000)
    assert spans.starts[0] == 0 and spans.ends[-1] == n and not spans.truncated
    assert np.all(spans.lengths <= size)
    assert np.all(spans.starts[1:] <= spans.ends[:-1])  # no gap between consecutive windows
    if n > size:
        assert np.all(spans.lengths == size)  # full windows, the last one ends at the end
        assert np.all(np.diff(spans.starts)[:-1] == stride)


def test_window_cap_is_reported_not_silent():
    spans = windows(10_000, 256, 128, max_windows=8)
    assert len(spans) == 8 and spans.truncated
    assert spans.starts.tolist() == [i * 128 for i in range(8)]


def test_past_the_cap_the_best_scored_windows_are_kept_in_document_order():
    spans = windows(2_000, 256, 128, max_windows=10_000)
    scores = np.zeros(len(spans))
    scores[[9, 2, 5]] = [3.0, 2.0, 1.0]
    kept = best_pieces(spans, scores, 2)
    assert kept.starts.tolist() == [spans.starts[2], spans.starts[9]] and kept.truncated
    assert kept.ends.tolist() == [spans.ends[2], spans.ends[9]]
    assert best_pieces(spans, np.zeros(len(spans)), 3).starts.tolist() == spans.starts[:3].tolist()  # ties: the earlier


def test_no_more_windows_than_the_cap_are_kept_as_they_are():
    spans = windows(600, 256, 128, max_windows=10_000)
    assert best_pieces(spans, np.arange(len(spans)), len(spans)) is spans and not spans.truncated
    empty = Spans(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    assert best_pieces(empty, np.zeros(1), 1) is empty


def test_empty_document_still_gets_one_window():
    spans = windows(0, 128, 64, 16)
    assert spans.starts.tolist() == [0] and spans.ends.tolist() == [0]


@pytest.mark.parametrize("size,stride", [(0, 1), (5, 0)])
def test_windows_reject_nonpositive_sizes(size, stride):
    with pytest.raises(ValueError):
        windows(10, size, stride, 4)
