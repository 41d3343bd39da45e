"""Stage 6: fold the scores of a document's sequences into one score.

``max`` (MaxP), ``sum`` (SumP), ``mean`` (AvgP), ``single`` (FirstP, KeyB2: one
sequence per document), ``lse`` (log-sum-exp: a soft max, where a second strong sequence adds and a weak
one hardly does; keyb2-blocks), and PARADE-Max / PARADE-Avg (Li et al., 2020): the
element-wise max / mean of the windows' pooled [CLS] vectors, put through the
cross-encoder's own classification head; ``trained``: a learned aggregator over the
pooled vectors (PARADE-Attn / PARADE-Transformer, aggregators.py). Vectorised with ``reduceat`` over the
sequences, which come grouped by document.

``fused_with_selector``: keyb2's folded scores plus the selector's own evidence, a setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

METHODS = ("single", "max", "sum", "mean", "lse", "parade-max", "parade-avg", "trained")


@dataclass(frozen=True, slots=True)
class ClassifierHead:
    """The cross-encoder's final Linear (exported next to the model)."""

    weight: np.ndarray
    """float32 [num_labels, H]."""
    bias: np.ndarray
    """float32 [num_labels]."""

    def __call__(self, pooled: np.ndarray) -> np.ndarray:
        # One relevance logit: the last label's (num_labels is 1 for rerankers).
        return (pooled @ self.weight.T + self.bias)[:, -1]


@dataclass(frozen=True, slots=True)
class Aggregated:
    """One score per document and the sequence that argues for it."""

    scores: np.ndarray
    """float64 [D] document scores."""
    best: np.ndarray
    """int64 [D] index of the document's highest-scoring sequence (its evidence)."""


def aggregate(
    method: str,
    doc_of: np.ndarray,
    logits: np.ndarray,
    pooled: np.ndarray | None = None,
    head: ClassifierHead | None = None,
    trained: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> Aggregated:
    """``doc_of`` [S] (non-decreasing, every document present) maps sequences to documents."""
    if method not in METHODS:
        raise ValueError(f"unknown aggregation {method!r}; expected one of {METHODS}")
    if doc_of.shape[0] and np.any(np.diff(doc_of) < 0):
        raise ValueError("sequences must be grouped by document")
    logits = np.asarray(logits, dtype=np.float64)
    firsts = np.flatnonzero(np.concatenate(([True], doc_of[1:] != doc_of[:-1])))
    counts = np.diff(np.append(firsts, doc_of.shape[0]))
    # Highest logit per document: sort by (document, -logit), take each group's first.
    order = np.lexsort((-logits, doc_of))
    best = order[firsts]

    if method == "single":
        if np.any(counts != 1):
            raise ValueError("'single' aggregation needs exactly one sequence per document")
        scores = logits[firsts]
    elif method == "max":
        scores = logits[best]
    elif method == "sum":
        scores = np.add.reduceat(logits, firsts)
    elif method == "mean":
        scores = np.add.reduceat(logits, firsts) / counts
    elif method == "lse":
        scores = np.logaddexp.reduceat(logits, firsts)
    elif method == "trained":
        if pooled is None or trained is None:
            raise ValueError("'trained' aggregation needs the pooled vectors and a trained aggregator")
        scores = trained(doc_of, np.asarray(pooled, dtype=np.float32))
    else:
        if pooled is None or head is None:
            raise ValueError(f"{method} needs the pooled vectors and the classifier head")
        pooled = np.asarray(pooled, dtype=np.float64)
        if method == "parade-max":
            folded = np.maximum.reduceat(pooled, firsts, axis=0)
        else:
            folded = np.add.reduceat(pooled, firsts, axis=0) / counts[:, None]
        scores = head(folded)
    return Aggregated(scores=np.asarray(scores, dtype=np.float64), best=best)


LENGTH_REFERENCE = 128
"""The input length (tokens) ``keyb2_blocks_length_bias`` leaves unchanged: serving and training shift by ln(n / it)."""


def length_calibrated(logits: np.ndarray, lengths: np.ndarray, bias: float) -> np.ndarray:
    """``logits`` + ``bias`` x ln(``lengths`` / LENGTH_REFERENCE): keyb2-blocks' inputs weighed by their length before
    log-sum-exp (``keyb2_blocks_length_bias``); the logits themselves when ``bias`` is 0."""
    if not bias:
        return logits
    return np.asarray(logits, dtype=np.float64) + bias * np.log(np.asarray(lengths, dtype=np.float64) / LENGTH_REFERENCE)


def fused_with_selector(scores: np.ndarray, block_scores: list[np.ndarray], weight: float) -> np.ndarray:
    """``scores`` + ``weight`` x each document's best block score, z-normalised over the documents.

    The selector saw every block; the model only the chosen ones. A document without a block (or
    with none scored) gets the mean (z = 0); equal best scores all get 0. The z-scores come from the
    request's documents, so with ``weight`` > 0 a document's score depends on the other candidates.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if weight == 0.0 or len(block_scores) < 2:
        return scores
    best = np.array([float(np.max(b)) if len(b) else np.nan for b in block_scores], dtype=np.float64)
    best[~np.isfinite(best)] = np.nan
    if np.all(np.isnan(best)):
        return scores
    spread = float(np.nanstd(best))
    z = np.zeros_like(best) if spread == 0.0 else (best - np.nanmean(best)) / spread
    return scores + weight * np.nan_to_num(z, nan=0.0)
