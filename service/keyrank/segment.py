"""Stage 2: cut each tokenized document into pieces, as index ranges on its tokens.

Two cuts:
- ``blocks``: CogLTX segmentation (Ding et al., 2020; used by KeyB2): blocks of at
  most 63 tokens, breaking where a break is cheap. Break after a token costs 0
  if a newline follows it, 1 after ``. ? !``, 2 after ``,`` and 8 anywhere else
  (a forced break); each block also costs ``block_cost`` so the DP does not cut
  needlessly short blocks. Dynamic programming finds the cheapest cut.
- ``windows``: sliding windows (MaxP/SumP/PARADE) or disjoint chunks (AvgP); past the
  per-document cap, either the first ones (``windows``) or the best-scored ones
  (``best_pieces``, given a score per window: BM25's, chosen in pipeline.py).

Pieces are ``Spans`` (token [start, end) arrays): views, never copies of text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from keyrank.tokenize import Encoded, TextTokenizer

NEWLINE_COST = 0.0
SENTENCE_END_COST = 1.0  # . ? !
COMMA_COST = 2.0
FORCED_COST = 8.0


@dataclass(frozen=True, slots=True)
class Spans:
    """Pieces of one document: token ranges [starts[i], ends[i])."""

    starts: np.ndarray
    """int64 [k] first token of each piece."""
    ends: np.ndarray
    """int64 [k] one past the last token of each piece."""
    truncated: bool = False
    """True when a cap dropped pieces past the end (windows)."""

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        return self.ends - self.starts


def per_document(flat: np.ndarray, pieces: list[Spans]) -> list[np.ndarray]:
    """Values of every piece of every document, flat in order, split back into one array per document."""
    return np.split(flat, np.cumsum([len(sp) for sp in pieces])[:-1])


def token_break_costs(tokenizer: TextTokenizer) -> np.ndarray:
    """Cost of a break right after each vocabulary entry (newlines come later, from the text)."""
    table = np.full(tokenizer.vocab_size, FORCED_COST, dtype=np.float64)
    for token, cost in ((".", SENTENCE_END_COST), ("?", SENTENCE_END_COST), ("!", SENTENCE_END_COST), (",", COMMA_COST)):
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            table[token_id] = cost
    return table


def break_costs(doc: Encoded, vocab_costs: np.ndarray) -> np.ndarray:
    """float64 [n]: cost of ending a block after token i (0 after the last token)."""
    n = len(doc)
    costs = vocab_costs[doc.ids]
    if n == 0:
        return costs
    # A newline in the gap between token i and token i+1 makes that break free.
    codepoints = np.frombuffer(doc.text.encode("utf-32-le"), dtype=np.uint32)
    newlines_before = np.concatenate(([0], np.cumsum(codepoints == 10)))
    gap_start, gap_end = doc.offsets[:-1, 1], doc.offsets[1:, 0]
    has_newline = newlines_before[gap_end] > newlines_before[gap_start]
    costs[:-1][has_newline] = NEWLINE_COST
    costs[-1] = 0.0
    return costs


@numba.njit(cache=True)
def cheapest_cut(costs: np.ndarray, max_tokens: int, block_cost: float) -> np.ndarray:
    # best[j]: cheapest cut of tokens [0, j); start[j]: where its last block starts, the earliest
    # cheapest i in [j - max_tokens, j). The minimum over that sliding range comes from a monotonic
    # queue of candidate starts (values non-decreasing from head to tail, ties kept in order, so the
    # head is the earliest minimum): O(n), not O(n * max_tokens).
    n = costs.shape[0]
    best = np.empty(n + 1, dtype=np.float64)
    start = np.zeros(n + 1, dtype=np.int64)
    queue = np.empty(n + 1, dtype=np.int64)
    head = 0
    tail = 0
    best[0] = 0.0
    for j in range(1, n + 1):
        i = j - 1
        while tail > head and best[queue[tail - 1]] > best[i]:
            tail -= 1
        queue[tail] = i
        tail += 1
        while queue[head] < j - max_tokens:
            head += 1
        arg = queue[head]
        best[j] = best[arg] + costs[j - 1] + block_cost
        start[j] = arg
    # Walk back from the end to list the block starts.
    count = 0
    j = n
    while j > 0:
        count += 1
        j = start[j]
    starts = np.empty(count, dtype=np.int64)
    j = n
    while j > 0:
        count -= 1
        j = start[j]
        starts[count] = j
    return starts


def blocks(doc: Encoded, vocab_costs: np.ndarray, max_tokens: int = 63, block_cost: float = 1.0) -> Spans:
    """CogLTX blocks covering the document exactly once, each at most ``max_tokens`` long."""
    n = len(doc)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Spans(empty, empty)
    starts = cheapest_cut(break_costs(doc, vocab_costs), max_tokens, block_cost)
    ends = np.append(starts[1:], n)
    return Spans(starts, ends)


def windows(n_tokens: int, size: int, stride: int, max_windows: int) -> Spans:
    """Windows of ``size`` tokens every ``stride`` tokens; the last one ends at the document's end.

    An empty document still gets one (empty) window so every document is scored.
    More than ``max_windows`` windows are cut to the first ``max_windows`` and
    the cut is reported (``truncated``), never silent.
    """
    if size < 1 or stride < 1:
        raise ValueError(f"window size and stride must be positive, got {size}, {stride}")
    if n_tokens <= size:
        return Spans(np.zeros(1, dtype=np.int64), np.full(1, n_tokens, dtype=np.int64))
    count = -(-(n_tokens - size) // stride) + 1
    starts = np.arange(count, dtype=np.int64) * stride
    starts[-1] = n_tokens - size  # keep the last window full-size
    starts = np.unique(starts)
    truncated = starts.shape[0] > max_windows
    starts = starts[:max_windows]
    return Spans(starts, np.minimum(starts + size, n_tokens), truncated=truncated)


def best_indices(scores: np.ndarray, most: int) -> np.ndarray:
    """int64 indices of the ``most`` highest ``scores`` (ties: the earlier), in increasing order."""
    return np.sort(np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:most])


def best_pieces(spans: Spans, scores: np.ndarray, most: int) -> Spans:
    """The ``most`` best-scored of ``spans`` (windows or blocks; ties: the earlier), in document order; ``spans``
    as they are when no more than that. The cut is reported (``truncated``), as ``windows``' is."""
    if len(spans) <= most:
        return spans
    keep = best_indices(scores, most)
    return Spans(spans.starts[keep], spans.ends[keep], truncated=True)
