"""Text the other candidates share: a block that most of the request's candidates also contain tells them apart
by nothing.

A lexical or dense selector scores a passage that recurs in many candidates (boilerplate, a quoted message, a
syndicated paragraph, or the query's strongest off-topic passage planted in every document of far-relevant's
``same-topic`` filler) as high in each of them, and keyb2 then reads that same text in every candidate: their
scores tie. ``shared_blocks`` finds such blocks across the request's documents: a block is shared when at
least half of its 8-token shingles (hashes of 8 consecutive token ids, which survive different block
boundaries) occur in at least ``share`` of the other documents. keyb2 does not choose those by score
(``keyb2_shared_share``, off by default: a document's selection then depends on the other candidates).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from keyrank.segment import Spans

SHINGLE = 8
"""Tokens per shingle: long enough that ordinary phrases of the query's topic do not count as shared text."""
_MIX = np.array([(0x9E3779B97F4A7C15 * (i + 1)) & 0x7FFFFFFFFFFFFFFF for i in range(SHINGLE)], dtype=np.int64)


def shingles(ids: np.ndarray) -> np.ndarray:
    """int64 [max(0, n - 7)]: a hash of each run of ``SHINGLE`` token ids, by where it starts (wrapping arithmetic)."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.shape[0] < SHINGLE:
        return np.empty(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(ids, SHINGLE)
    with np.errstate(over="ignore"):
        return (windows * _MIX).sum(axis=1)


def shared_blocks(ids: Sequence[np.ndarray], blocks: Sequence[Spans], share: float) -> list[np.ndarray]:
    """bool [blocks] per document: the block's text is shared (module doc). Fewer than 3 documents: none is."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"a share of the other candidates lies in (0, 1], got {share}")
    n = len(ids)
    if n < 3:
        return [np.zeros(len(b), dtype=bool) for b in blocks]
    hashes = [shingles(d) for d in ids]
    sizes = [h.size for h in hashes]
    # Two sorts for the whole request, not one per document: each shingle's id, then the distinct
    # (shingle, document) pairs, counted per shingle.
    distinct, inverse = np.unique(np.concatenate(hashes), return_inverse=True)
    owner = np.repeat(np.arange(n, dtype=np.int64), sizes)
    documents = np.bincount(np.unique(inverse.reshape(-1) * n + owner) // n, minlength=distinct.size)
    others = np.split(documents[inverse.reshape(-1)] - 1, np.cumsum(sizes)[:-1])
    need = max(1, math.ceil(share * (n - 1)))
    out = []
    for h, elsewhere, spans in zip(hashes, others, blocks):
        common = elsewhere >= need
        # a shingle belongs to the block it starts in; a block shorter than a shingle is judged by the one starting there
        cum = np.concatenate([[0], np.cumsum(common, dtype=np.int64)])
        starts = np.minimum(spans.starts, h.size)
        ends = np.minimum(np.maximum(spans.ends - SHINGLE + 1, spans.starts + 1), h.size)  # >= starts
        count = ends - starts
        hits = cum[ends] - cum[starts]
        out.append((count > 0) & (2 * hits >= count))
    return out
