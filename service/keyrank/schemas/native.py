"""POST /rerank: keyrank's own shape (strategy, selector, evidence, usage, timings)."""

from __future__ import annotations

from pydantic import ConfigDict, Field, field_validator

from keyrank.config import Selector, Strategy
from keyrank.schemas.common import (
    EXAMPLE_DOCS,
    EXAMPLE_QUERY,
    Count,
    StrictRequest,
    Wire,
    non_blank,
    query_field,
)


class DocumentIn(StrictRequest):
    """A document with the caller's id, echoed back in the results."""

    id: str | None = Field(None, max_length=512, examples=["doc-42"])
    """Caller's id, echoed in results[].id."""
    text: str
    """The document text; evidence offsets index into it."""


class RerankRequest(StrictRequest):
    """POST /rerank: rank ``documents`` by relevance to ``query``."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"query": EXAMPLE_QUERY, "documents": EXAMPLE_DOCS, "strategy": "keyb2", "top_n": 1}]}
    )

    query: str = query_field()
    """The search query, non-blank, at most KEYRANK_MAX_QUERY_CHARS characters (default 2000); the model reads its
    first KEYRANK_QUERY_MAX_TOKENS tokens (default 32)."""
    documents: list[str | DocumentIn] = Field(min_length=1, examples=[EXAMPLE_DOCS])
    """Candidates as strings or {id, text}: at most KEYRANK_MAX_DOCUMENTS (default 1000), each at most
    KEYRANK_MAX_DOCUMENT_CHARS characters (default 400000). An empty or whitespace-only document is not
    scored: it ranks after every other document with relevance_score -10000 (0 in the vendor shapes)."""
    strategy: Strategy | None = Field(None, examples=["keyb2"])
    """How long documents are read; unset = KEYRANK_DEFAULT_STRATEGY (keyb2-blocks)."""
    selector: Selector | None = Field(None, examples=["bm25"])
    """Key-block selector of keyb2; unset = KEYRANK_DEFAULT_SELECTOR (bm25)."""
    top_n: Count | None = Field(None, examples=[10])
    """Return only the best top_n results; unset = all."""
    return_documents: bool = False
    """Echo each result's text, and the text of its evidence spans."""
    return_evidence: bool = True
    """Return the character spans the score was based on."""
    max_tokens_per_doc: Count | None = Field(None, examples=[4096])
    """Read at most this many tokens of each document; cut documents are flagged `truncated`."""
    model: str | None = Field(None, examples=["ce-minilm-l6"])
    """With several models served (KEYRANK_MODELS): the one to rank with, by the name answers report (GET
    /v1/models lists them); unset = the default (KEYRANK_DEFAULT_MODEL); a name not served = 422 listing the
    served names. With one model served: it ranks, and another name is named in X-Keyrank-Ignored-Fields."""

    _query_not_blank = field_validator("query")(non_blank)

    def texts(self) -> list[str]:
        """The document texts, in request order."""
        return [d if isinstance(d, str) else d.text for d in self.documents]

    def ids(self) -> list[str | None]:
        """The caller's ids (None for plain strings), in request order."""
        return [None if isinstance(d, str) else d.id for d in self.documents]


class EvidenceOut(Wire):
    """A span of the caller's document that the score was based on."""

    start: int
    """Character offset of the span's start in the document text."""
    end: int
    """Character offset one past the span's end."""
    text: str | None = None
    """text[start:end]; only with return_documents."""


class DocumentOut(Wire):
    """The document's text, echoed when asked for."""

    text: str
    """The document text as sent."""


class RerankResult(Wire):
    """One ranked document."""

    index: int
    """Position of the document in the request's documents."""
    id: str | None = None
    """The caller's id, when the document was sent as {id, text}."""
    relevance_score: float
    """Higher is more relevant: the cross-encoder's logit, or the strategy's aggregate of logits."""
    evidence: list[EvidenceOut] | None = None
    """Spans read for the score (keyb2: selected blocks; maxp: best window); with return_evidence."""
    document: DocumentOut | None = None
    """The document; with return_documents."""
    truncated: bool
    """True whenever the model did not read the whole document (read_tokens < document_tokens): firstp read a
    prefix, keyb2 chose some blocks, windows were capped (KEYRANK_MAX_WINDOWS_PER_DOC), or max_tokens_per_doc cut it."""
    read_tokens: int
    """Tokens of the document the score rests on: keyb2's selected blocks, the union of the windows scored
    (maxp, sump, avgp, parade-*), firstp's prefix."""
    document_tokens: int
    """Tokens the whole document has (the model's tokenizer, before max_tokens_per_doc)."""


class UsageOut(Wire):
    """What the request cost."""

    query_tokens: int
    """Query tokens fed to the model."""
    document_tokens: int
    """Tokens of all documents in the request."""
    scored_tokens: int
    """Tokens sent to the cross-encoder, special tokens included, padding not."""
    scored_sequences: int
    """Sequences sent to the cross-encoder (the cross selector's included)."""
    truncated_documents: int
    """Documents the model did not read whole (results with truncated: true)."""


class TimingsOut(Wire):
    """Wall time per stage in milliseconds, also sent as the Server-Timing header."""

    tokenize: float
    """Tokenizing query and documents."""
    segment: float
    """Cutting documents into blocks or windows."""
    select: float | None = None
    """Choosing key blocks (strategies that select; absent otherwise, not 0)."""
    assemble: float = 0.0
    """Building the cross-encoder's input sequences."""
    infer: float
    """The cross-encoder on Triton."""
    aggregate: float
    """Folding piece scores into document scores."""
    total: float
    """The whole request inside the gateway."""


class RerankResponse(Wire):
    """POST /rerank answer: results sorted by relevance_score, best first."""

    model: str
    """The cross-encoder that scored the documents."""
    strategy: Strategy
    """The strategy used."""
    selector: Selector | None = None
    """The key-block selector used; null unless strategy is keyb2."""
    results: list[RerankResult]
    """Best first, cut to top_n."""
    usage: UsageOut
    """What the request cost."""
    timings_ms: TimingsOut
    """Wall time per stage in milliseconds."""
