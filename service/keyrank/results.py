"""What a rerank call answers (``Reranker.arank``): the ranking, each document's place and evidence, the usage.

Plain dataclasses, apart from the HTTP wire types (``schemas/``), which the dialects' routes translate them into.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Evidence:
    """A stretch of the caller's document the score rests on."""

    start: int
    """Character offset of its first character."""
    end: int
    """Character offset one past its last character."""
    piece: int | None = None
    """Index of the block (keyb2) or window (maxp, ...) it came from."""


@dataclass(frozen=True, slots=True)
class RankedDocument:
    """One document's place in the ranking."""

    index: int
    """Position of the document in the request."""
    score: float
    """Relevance score (the cross-encoder's logit scale; higher is more relevant)."""
    evidence: list[Evidence]
    """What the score rests on (selected blocks, best window, or the first passage)."""
    truncated: bool
    """The model did not read the whole document: ``read_tokens < document_tokens``."""
    read_tokens: int = 0
    """Document tokens the score rests on (keyb2: the selected blocks; windowed strategies: the union of
    the windows scored; firstp: the prefix)."""
    document_tokens: int = 0
    """Tokens the whole document has (before ``max_tokens_per_doc``)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """What the request cost."""

    query_tokens: int
    """Query tokens fed to the model (after the query cap)."""
    document_tokens: int
    """Document tokens read (after ``max_tokens_per_doc``)."""
    scored_tokens: int
    """Tokens sent to the cross-encoder, special tokens included, padding excluded."""
    scored_sequences: int
    """Sequences sent to the cross-encoder (the cross selector's included)."""
    truncated_documents: int
    """Documents the model did not read whole (``RankedDocument.truncated``)."""


@dataclass(frozen=True, slots=True)
class Ranking:
    """The answer to one rerank call."""

    model: str
    """The cross-encoder's source (hub id or checkpoint folder name)."""
    strategy: str
    """Strategy used."""
    selector: str | None
    """Block selector (keyb2 only)."""
    results: list[RankedDocument]
    """Documents by descending score, cut to ``top_n``."""
    usage: Usage
    """Token and sequence counts."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    """Wall time per stage and in total."""
