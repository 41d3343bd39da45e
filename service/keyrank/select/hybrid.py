"""Hybrid selector: BM25 and the bi-encoder fused by reciprocal rank fusion.

Lexical and dense scores live on unrelated scales (BM25 is unbounded, a
cosine sits in [-1, 1]), so they are fused by rank, not by value: RRF
(Cormack et al., 2009) gives each block ``sum 1 / (k + rank)`` over the
selectors, rank 1 being a selector's best block. ``k = 60`` is the paper's
constant: it damps the gap between the very first ranks so one selector's
favourite cannot outvote a block both selectors like. Tied scores share their
best rank, so the many blocks BM25 scores 0 (no query term) fall together
instead of being ordered by position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from keyrank.select import SelectorContext
    from keyrank.segment import Spans
    from keyrank.tokenize import Encoded

RRF_K = 60
"""Cormack et al.'s constant."""


def competition_ranks(scores: np.ndarray) -> np.ndarray:
    """int64 [B]: 1 + how many blocks score strictly higher (ties share the best rank: 1, 2, 2, 4)."""
    scores = np.asarray(scores, dtype=np.float64)
    descending = np.sort(-scores)
    return np.searchsorted(descending, -scores, side="left").astype(np.int64) + 1


def reciprocal_rank_fusion(*block_scores: np.ndarray, k: float = RRF_K) -> np.ndarray:
    """float64 [B]: RRF of one document's block scores from several selectors (same blocks, same order)."""
    if not block_scores:
        raise ValueError("reciprocal_rank_fusion needs at least one score array")
    sizes = {np.shape(s) for s in block_scores}
    if len(sizes) != 1 or len(next(iter(sizes))) != 1:
        raise ValueError(f"every selector must score the same blocks, got shapes {sorted(sizes)}")
    if k < 0:
        raise ValueError(f"the RRF constant must be >= 0, got {k}")
    return sum(1.0 / (k + competition_ranks(s)) for s in block_scores)


def hybrid_scores(lexical: Sequence[np.ndarray], dense: Sequence[np.ndarray], k: float = RRF_K) -> list[np.ndarray]:
    """Per document, the RRF of its BM25 and bi-encoder block scores (the ``hybrid`` selector)."""
    if len(lexical) != len(dense):
        raise ValueError(f"{len(lexical)} documents scored by BM25 but {len(dense)} by the bi-encoder")
    return [reciprocal_rank_fusion(a, b, k=k) for a, b in zip(lexical, dense)]


class HybridSelector:
    """The ``hybrid`` selector: reciprocal rank fusion of the bm25 and the dense ranking of each document's blocks
    (the pipeline's own bm25 and dense selectors, so their caches are shared)."""

    def __init__(self, context: SelectorContext):
        self.lexical = context.block_selector("bm25")
        self.dense = context.block_selector("dense")
        self.k = context.settings.hybrid_rrf_k
        """The RRF constant (``hybrid_rrf_k``)."""

    def score(self, query_text: str, query: Encoded, docs: list[Encoded], pieces: list[Spans]) -> list[np.ndarray]:
        return hybrid_scores(self.lexical.score(query_text, query, docs, pieces),
                             self.dense.score(query_text, query, docs, pieces), k=self.k)


def build(context: SelectorContext) -> HybridSelector:
    return HybridSelector(context)
