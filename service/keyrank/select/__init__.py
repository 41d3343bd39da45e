"""Stage 3 (keyb2 only): score each block of each document against the query.

``REGISTRY`` is the one table of selectors, beside the strategies' table: the
config's ``Selector`` type, the API's enum, request resolution (resolved.py:
is the bi-encoder there?), the adaptive budget (strategies/keyb2.py),
admission's cost estimate, training and the README's table all read it.
Adding a selector is its own module (a ``build(context)`` returning a
``BlockSelector``) and one row here.

A selector is an object built once per pipeline (``Pipeline.block_selector``) that
owns its state (an IDF table, an ONNX Runtime session, an embedding cache) and
is given only what it scores: the query and the documents' blocks. Selectors
return scores, or (the cross selector) a ``ModelRoundTrip`` whose sequences the
caller has the model score; choosing blocks under the budget is the keyb2
strategy's job.
This module imports nothing heavy: a row names its module, which the pipeline
imports on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from keyrank.config import Settings
from keyrank.scoring import ModelInputs

if TYPE_CHECKING:
    from keyrank.doc_cache import DocumentCache
    from keyrank.segment import Spans
    from keyrank.template import InputTemplate
    from keyrank.tokenize import Encoded, TextTokenizer


@dataclass(frozen=True, slots=True)
class ModelRoundTrip:
    """A selector's answer that needs the cross-encoder first (the cross selector): the sequences the caller has
    the model score, and how their logits become each document's block scores."""

    inputs: ModelInputs
    """The sequences to score (the cross selector: each block alone with the query)."""
    scores: Callable[[np.ndarray], list[np.ndarray]]
    """The logits of ``inputs``, in their order, as the block scores of each document."""


class BlockSelector(Protocol):
    """Scores every block of every document against the query (a gateway selector, built once per pipeline)."""

    def score(self, query_text: str, query: Encoded, docs: list[Encoded], pieces: list[Spans]) -> list[np.ndarray] | ModelRoundTrip:
        """One score per block of each document: ``query_text`` as sent, ``query`` its (capped) tokens,
        ``pieces`` each document's blocks; or, for a selector the model scores, the round trip that gives them."""
        ...


@dataclass(frozen=True, slots=True)
class SelectorContext:
    """What a selector may be built from: one pipeline's settings, tokenizer and caches, nothing of its flow."""

    settings: Settings
    """The stage parameters (BM25's k1, b and IDF source, the bi-encoder's cache and batch)."""
    tokenizer: TextTokenizer
    """The cross-encoder's tokenizer (BM25's terms are its word pieces)."""
    template: InputTemplate
    """How the cross-encoder frames the query and a block (the cross selector's inputs)."""
    is_term: np.ndarray
    """bool [vocab]: which token ids are BM25 terms (no punctuation, no special tokens)."""
    documents: DocumentCache
    """Blocks' BM25 terms of documents seen before (doc_cache.py)."""
    gateway_dir: Path | None
    """Where the prepared bi-encoder lives (``bi_encoder/``); None: nowhere."""
    block_selector: Callable[[str], BlockSelector]
    """Another block selector of the same pipeline, by name (hybrid fuses bm25 and dense)."""


@dataclass(frozen=True, slots=True)
class SelectorSpec:
    """One block selector: where it scores, what its scores mean, what it costs."""

    name: str
    """The API's name for it."""
    scored_by: Literal["gateway", "model"]
    """``gateway``: scored in-process on the CPU; ``model``: every block is sent alone with the query to the
    cross-encoder first (its selector answers a ``ModelRoundTrip``, one extra round trip awaited by the reranker)."""
    module: str
    """The module whose ``build(context: SelectorContext) -> BlockSelector`` makes it."""
    ratio_scale: bool
    """Scores are >= 0 with a meaningful zero, so "at least a share of the best block" is a sound rule
    (``keyb2_min_score_share``, the adaptive budget); cosines and logits are not."""
    bi_encoder: bool
    """Needs the prepared bi-encoder (models/gateway/bi_encoder), and embeds each block not seen before."""
    sequences_per_block: float
    """Admission's cost model: work per block in cross-encoder sequences (512 tokens) before assembly:
    1 for the cross selector (each block is one model input); a bi-encoder pass over a 63-token block is
    about 1/8 of a 512-token cross-encoder pass (same MiniLM-L6 body, 1/8 of the tokens); BM25 is free."""
    summary: str
    """How it scores blocks (docs and OpenAPI)."""

    def build(self, context: SelectorContext) -> BlockSelector:
        """The selector object, from its module's ``build``."""
        return importlib.import_module(self.module).build(context)


REGISTRY: dict[str, SelectorSpec] = {
    spec.name: spec
    for spec in (
        SelectorSpec("bm25", "gateway", "keyrank.select.bm25", ratio_scale=True, bi_encoder=False, sequences_per_block=0.0,
                     summary="BM25 over the block's terms (k1 0.9, b 0.4), smoothed IDF"),
        SelectorSpec("dense", "gateway", "keyrank.select.dense", ratio_scale=False, bi_encoder=True, sequences_per_block=0.125,
                     summary="all-MiniLM-L6-v2 cosine of query and block, in-process (OpenVINO bf16 where the CPU has it, else ONNX Runtime), embeddings cached"),
        SelectorSpec("cross", "model", "keyrank.select.cross", ratio_scale=False, bi_encoder=False, sequences_per_block=1.0,
                     summary="the cross-encoder's score of each block alone with the query"),
        SelectorSpec("hybrid", "gateway", "keyrank.select.hybrid", ratio_scale=False, bi_encoder=True, sequences_per_block=0.125,
                     summary="reciprocal rank fusion of the bm25 and dense rankings"),
    )
}
# SELECTORS (names.py) names these rows in this order; tests/test_strategy_registry.py keeps the two equal.


def markdown_table() -> str:
    """The README's selector table, written from the registry (a test keeps the README equal to it)."""
    rows = ["| selector | scored by | how it scores blocks | adaptive budget |", "| --- | --- | --- | --- |"]
    for s in REGISTRY.values():
        rows.append(f"| `{s.name}` | {s.scored_by} | {s.summary} | {'yes' if s.ratio_scale else '-'} |")
    return "\n".join(rows)
