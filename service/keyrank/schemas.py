"""Wire format of the HTTP API: requests and responses, apart from any logic.

Three dialects map onto the same pipeline:
- ``POST /rerank``: keyrank's own shape (strategy, selector, evidence, timings);
- ``POST /v1/rerank``: Jina AI's rerank shape;
- ``POST /v2/rerank``: Cohere's v2 rerank shape.

Each field's docstring is its description on the OpenAPI page
(``use_attribute_docstrings``). Request models reject unknown fields. Limits
that depend on settings (documents per request, characters per document and
query) are checked by ``check_limits`` once the body is parsed, so the message
can name the setting that sets them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from keyrank.config import Selector, Settings, Strategy
from keyrank.errors import InvalidRequest

_QUERY = "what is the capital of the united states"
_DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
]


class _Wire(BaseModel):
    """Response models: field docstrings document the OpenAPI schema."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class _Strict(_Wire):
    """Request models: an unknown field is an error, not silently dropped."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")


def _non_blank(query: str) -> str:
    if not query.strip():
        raise ValueError("query must contain a non-whitespace character")
    return query


# --------------------------------------------------------------------------- /rerank


class DocumentIn(_Strict):
    """A document with the caller's id, echoed back in the results."""

    id: str | None = Field(None, max_length=512, examples=["doc-42"])
    """Caller's id, echoed in results[].id."""
    text: str
    """The document text; evidence offsets index into it."""


class RerankRequest(_Strict):
    """POST /rerank: rank ``documents`` by relevance to ``query``."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"query": _QUERY, "documents": _DOCS, "strategy": "keyb2", "top_n": 1}]}
    )

    query: str = Field(min_length=1, examples=[_QUERY])
    """The search query, non-blank, at most KEYRANK_MAX_QUERY_CHARS characters (default 2000); the model reads its
    first KEYRANK_QUERY_MAX_TOKENS tokens (default 32)."""
    documents: list[str | DocumentIn] = Field(min_length=1, examples=[_DOCS])
    """Candidates as strings or {id, text}: at most KEYRANK_MAX_DOCUMENTS (default 1000), each at most
    KEYRANK_MAX_DOCUMENT_CHARS characters (default 400000)."""
    strategy: Strategy | None = Field(None, examples=["keyb2"])
    """How long documents are read; unset = KEYRANK_DEFAULT_STRATEGY (keyb2)."""
    selector: Selector | None = Field(None, examples=["bm25"])
    """Key-block selector of keyb2; unset = KEYRANK_DEFAULT_SELECTOR (bm25)."""
    top_n: int | None = Field(None, ge=1, examples=[10])
    """Return only the best top_n results; unset = all."""
    return_documents: bool = False
    """Echo each result's text, and the text of its evidence spans."""
    return_evidence: bool = True
    """Return the character spans the score was based on."""
    max_tokens_per_doc: int | None = Field(None, ge=1, examples=[4096])
    """Read at most this many tokens of each document; cut documents are flagged `truncated`."""

    _query_not_blank = field_validator("query")(_non_blank)

    def texts(self) -> list[str]:
        """The document texts, in request order."""
        return [d if isinstance(d, str) else d.text for d in self.documents]

    def ids(self) -> list[str | None]:
        """The caller's ids (None for plain strings), in request order."""
        return [None if isinstance(d, str) else d.id for d in self.documents]


class EvidenceOut(_Wire):
    """A span of the caller's document that the score was based on."""

    start: int
    """Character offset of the span's start in the document text."""
    end: int
    """Character offset one past the span's end."""
    text: str | None = None
    """text[start:end]; only with return_documents."""


class DocumentOut(_Wire):
    """The document's text, echoed when asked for."""

    text: str
    """The document text as sent."""


class RerankResult(_Wire):
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
    """True when part of the document was not read (max_tokens_per_doc or the window cap)."""


class UsageOut(_Wire):
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
    """Documents not read to the end."""


class TimingsOut(_Wire):
    """Wall time per stage in milliseconds, also sent as the Server-Timing header."""

    tokenize: float
    """Tokenizing query and documents."""
    segment: float
    """Cutting documents into blocks or windows."""
    select: float
    """Choosing key blocks (keyb2)."""
    assemble: float = 0.0
    """Building the cross-encoder's input sequences."""
    infer: float
    """The cross-encoder on Triton."""
    aggregate: float
    """Folding piece scores into document scores."""
    total: float
    """The whole request inside the gateway."""


class RerankResponse(_Wire):
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


# --------------------------------------------------------------------------- Jina: /v1/rerank


class JinaDocumentIn(_Strict):
    """A Jina document object; only text documents are supported."""

    text: str
    """The document text."""


class JinaRerankRequest(_Strict):
    """POST /v1/rerank in Jina AI's shape, ranked with the default strategy and selector."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"model": "jina-reranker-v2-base-multilingual", "query": _QUERY, "documents": _DOCS, "top_n": 1}]
        }
    )

    model: str | None = None
    """Accepted for compatibility and ignored: the service hosts one model."""
    query: str = Field(min_length=1, examples=[_QUERY])
    """The search query, non-blank."""
    documents: list[str | JinaDocumentIn] = Field(min_length=1, examples=[_DOCS])
    """Strings or {text}; same limits as POST /rerank."""
    top_n: int | None = Field(None, ge=1)
    """Return only the best top_n results; unset = all."""
    return_documents: bool = True
    """Echo each result's text (Jina's default: true)."""

    _query_not_blank = field_validator("query")(_non_blank)

    def texts(self) -> list[str]:
        """The document texts, in request order."""
        return [d if isinstance(d, str) else d.text for d in self.documents]


class JinaUsage(_Wire):
    """Jina's usage block."""

    total_tokens: int
    """Tokens the cross-encoder read (keyrank's scored_tokens)."""


class JinaResult(_Wire):
    """One ranked document, Jina shape."""

    index: int
    """Position of the document in the request."""
    relevance_score: float
    """sigmoid of keyrank's score: in (0, 1) as Jina clients expect, same order."""
    document: DocumentOut | None = None
    """The document; with return_documents."""


class JinaRerankResponse(_Wire):
    """POST /v1/rerank answer."""

    model: str
    """The cross-encoder that scored the documents."""
    usage: JinaUsage
    """Tokens read."""
    results: list[JinaResult]
    """Best first, cut to top_n."""


# --------------------------------------------------------------------------- Cohere: /v2/rerank


class CohereRerankRequest(_Strict):
    """POST /v2/rerank in Cohere's v2 shape, ranked with the default strategy and selector."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"model": "rerank-v3.5", "query": _QUERY, "documents": _DOCS, "top_n": 1}]}
    )

    model: str
    """Required by Cohere's API; accepted and ignored (the service hosts one model)."""
    query: str = Field(min_length=1, examples=[_QUERY])
    """The search query, non-blank."""
    documents: list[str] = Field(min_length=1, examples=[_DOCS])
    """Plain-text documents; same limits as POST /rerank."""
    top_n: int | None = Field(None, ge=1)
    """Return only the best top_n results; unset = all."""
    max_tokens_per_doc: int | None = Field(None, ge=1)
    """Read at most this many tokens of each document; unset = as the strategy reads (Cohere cuts at 4096)."""

    _query_not_blank = field_validator("query")(_non_blank)


class CohereResult(_Wire):
    """One ranked document, Cohere shape."""

    index: int
    """Position of the document in the request."""
    relevance_score: float
    """sigmoid of keyrank's score: in (0, 1) as Cohere clients expect, same order."""


class CohereApiVersion(_Wire):
    """Cohere's api_version block."""

    version: Literal["2"] = "2"
    """Always "2"."""


class CohereBilledUnits(_Wire):
    """Cohere's billing block."""

    search_units: int
    """One per started 100 documents, as Cohere counts a search unit."""


class CohereMeta(_Wire):
    """Cohere's meta block."""

    api_version: CohereApiVersion = CohereApiVersion()
    """Always version 2."""
    billed_units: CohereBilledUnits
    """Search units of the request."""


class CohereRerankResponse(_Wire):
    """POST /v2/rerank answer."""

    id: str
    """The request id (also the X-Request-ID header)."""
    results: list[CohereResult]
    """Best first, cut to top_n."""
    meta: CohereMeta
    """API version and billing."""


# --------------------------------------------------------------------------- errors


class ErrorBody(_Wire):
    """What went wrong, readable by a person."""

    type: str = Field(examples=["invalid_request"])
    """Kind of error: invalid_request, invalid_json, limit_exceeded, body_too_large, unauthorized, not_found,
    unavailable, internal."""
    message: str
    """What was wrong and, for a limit, the setting that sets it."""
    field: str | None = Field(None, examples=["documents[3]"])
    """The request field at fault."""
    request_id: str | None = None
    """Quote it when reporting a problem; it is in the server's log."""
    details: list[dict[str, Any]] | None = None
    """Every validation error, when there were several."""


class ErrorResponse(_Wire):
    """Every 4xx and 5xx answer."""

    error: ErrorBody
    """What went wrong."""


# --------------------------------------------------------------------------- limits


class LimitExceeded(InvalidRequest):
    """A configured request limit was exceeded (-> 422); ``setting`` names the environment variable."""

    def __init__(self, field: str, what: str, limit: int, setting: str):
        super().__init__(f"{field}: {what} exceed the limit of {limit} ({setting})", field=field)
        self.setting = setting


def check_limits(query: str, texts: list[str], settings: Settings) -> None:
    """Raise LimitExceeded, naming the setting, when a configured limit is exceeded."""
    if len(texts) > settings.max_documents:
        raise LimitExceeded("documents", f"{len(texts)} documents", settings.max_documents, "KEYRANK_MAX_DOCUMENTS")
    if len(query) > settings.max_query_chars:
        raise LimitExceeded("query", f"{len(query)} characters", settings.max_query_chars, "KEYRANK_MAX_QUERY_CHARS")
    for i, text in enumerate(texts):
        if len(text) > settings.max_document_chars:
            raise LimitExceeded(
                f"documents[{i}]", f"{len(text)} characters", settings.max_document_chars, "KEYRANK_MAX_DOCUMENT_CHARS"
            )
