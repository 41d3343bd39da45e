"""Wire format of the HTTP API: requests and responses, apart from any logic.

Three dialects map onto the same pipeline:
- ``POST /rerank``: keyrank's own shape (strategy, selector, evidence, timings);
- ``POST /v1/rerank``: Jina AI's rerank shape;
- ``POST /v2/rerank``: Cohere's v2 rerank shape.

Each field's docstring is its description on the OpenAPI page
(``use_attribute_docstrings``). Requests are validated in strict mode: a value
of the wrong JSON type is an error, never coerced ("3" is not an integer).
keyrank's own shape rejects unknown fields; the vendor shapes accept them
(a newer SDK may send more) and the answer names them in
``X-Keyrank-Ignored-Fields``. Limits that depend on settings (documents per
request, characters per document and query) are not here: api/limits.py
checks them and the OpenAPI schema carries them as maxItems/maxLength
(api/app.py), so the message can name the setting that sets them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
)

from keyrank.config import Selector, Strategy

_QUERY = "what is the capital of the united states"
_DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
]


class _Wire(BaseModel):
    """Response models: field docstrings document the OpenAPI schema."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class _Strict(_Wire):
    """keyrank's requests: types are not coerced and an unknown field is an error, not silently dropped."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid", strict=True)


class _Vendor(_Wire):
    """Jina/Cohere requests: types are not coerced; unknown fields are accepted and reported as ignored."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="allow", strict=True)


NON_BLANK = r"\S"
"""JSON Schema pattern of a query: at least one non-whitespace character (checked with a readable message)."""


def _non_blank(query: str) -> str:
    if not query.strip():
        raise ValueError("query must contain a non-whitespace character")
    return query


def _whole_number(value: Any) -> Any:
    """JSON Schema counts 3.0 as an integer: take it as 3 (and nothing else that is not an int)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Integer = Annotated[int, BeforeValidator(_whole_number)]
"""A JSON integer, or a number with no fraction (3.0); never "3" or true."""
Count = Annotated[int, Field(ge=1), BeforeValidator(_whole_number)]  # this order keeps `minimum` in the schema
"""An ``Integer`` of at least 1."""


def _query_field(**extra: Any) -> Any:
    return Field(min_length=1, examples=[_QUERY], json_schema_extra={"pattern": NON_BLANK}, **extra)


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

    query: str = _query_field()
    """The search query, non-blank, at most KEYRANK_MAX_QUERY_CHARS characters (default 2000); the model reads its
    first KEYRANK_QUERY_MAX_TOKENS tokens (default 32)."""
    documents: list[str | DocumentIn] = Field(min_length=1, examples=[_DOCS])
    """Candidates as strings or {id, text}: at most KEYRANK_MAX_DOCUMENTS (default 1000), each at most
    KEYRANK_MAX_DOCUMENT_CHARS characters (default 400000). An empty or whitespace-only document is not
    scored: it ranks after every other document with relevance_score -10000 (0 in the vendor shapes)."""
    strategy: Strategy | None = Field(None, examples=["keyb2"])
    """How long documents are read; unset = KEYRANK_DEFAULT_STRATEGY (keyb2)."""
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




# --------------------------------------------------------------------------- Jina and Cohere v1: /v1/rerank

_VENDOR_OBJECT_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "The document text."}},
    "required": ["text"],
    "description": "An object document: its `text` is read; with rank_fields, those fields are read instead "
    "(Cohere v1), and then `text` may be absent.",
}
VendorDocument = str | Annotated[dict[str, Any], WithJsonSchema(_VENDOR_OBJECT_SCHEMA)]
"""A string, or an object: its ``text`` field is read, or the ``rank_fields`` as "field: value" lines."""


class V1RerankRequest(_Vendor):
    """POST /v1/rerank: Jina AI's shape, which Cohere's v1 shape extends; both clients post here."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"model": "jina-reranker-v2-base-multilingual", "query": _QUERY, "documents": _DOCS, "top_n": 1}]
        }
    )

    model: str | None = None
    """Accepted; the service hosts one model (named in the answer). Listed as ignored when it names another."""
    query: str = _query_field()
    """The search query, non-blank; same limits as POST /rerank."""
    documents: list[VendorDocument] = Field(min_length=1, examples=[_DOCS])
    """Strings, or objects with a ``text`` field (or the ``rank_fields``); same limits as POST /rerank."""
    top_n: Count | None = None
    """Return only the best top_n results; unset = all."""
    return_documents: bool = True
    """Echo each result's document (Jina's default: true)."""
    rank_fields: list[str] | None = None
    """Cohere v1: the fields of object documents that are read, as "field: value" lines; unset = ``text``."""
    max_tokens_per_doc: Count | None = None
    """Read at most this many tokens of each document."""
    max_chunks_per_doc: Count | None = None
    """Cohere v1: accepted and ignored; KEYRANK_MAX_WINDOWS_PER_DOC caps windows per document."""
    return_embeddings: bool | None = None
    """Jina: accepted and ignored; a cross-encoder has no document embeddings."""

    _query_not_blank = field_validator("query")(_non_blank)


class VendorDocumentOut(_Wire):
    """The document as sent: {"text": ...} for a string; an object is echoed as it came."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="allow")

    text: str | None = None
    """The document text (for a string document)."""


class VendorResult(_Wire):
    """One ranked document, Jina/Cohere shape."""

    index: int
    """Position of the document in the request."""
    relevance_score: float
    """sigmoid of keyrank's score: in (0, 1) as Jina and Cohere clients expect, same order."""
    document: VendorDocumentOut | None = None
    """The document; with return_documents."""


class JinaUsage(_Wire):
    """Jina's usage block."""

    total_tokens: int
    """Tokens the cross-encoder read (keyrank's scored_tokens)."""


class CohereApiVersion(_Wire):
    """Cohere's api_version block."""

    version: Literal["1", "2"] = "2"
    """The Cohere API version of the route: "1" on /v1/rerank, "2" on /v2/rerank."""


class CohereBilledUnits(_Wire):
    """Cohere's billing block."""

    search_units: int
    """One per started 100 documents, as Cohere counts a search unit."""


class CohereMeta(_Wire):
    """Cohere's meta block."""

    api_version: CohereApiVersion
    """Version of the Cohere shape."""
    billed_units: CohereBilledUnits
    """Search units of the request."""


class V1RerankResponse(_Wire):
    """POST /v1/rerank answer: Jina's fields (model, usage, results) and Cohere v1's (id, results, meta)."""

    id: str
    """The request id (also the X-Request-ID header)."""
    model: str
    """The cross-encoder that scored the documents (KEYRANK_MODEL_NAME)."""
    usage: JinaUsage
    """Tokens read."""
    results: list[VendorResult]
    """Best first, cut to top_n."""
    meta: CohereMeta
    """Cohere v1's API version and billing."""


# --------------------------------------------------------------------------- Cohere v2: /v2/rerank


class CohereRerankRequest(_Vendor):
    """POST /v2/rerank in Cohere's v2 shape, ranked with the default strategy and selector."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"model": "rerank-v3.5", "query": _QUERY, "documents": _DOCS, "top_n": 1}]}
    )

    model: str
    """Required by Cohere's API; the service hosts one model. Listed as ignored when it names another."""
    query: str = _query_field()
    """The search query, non-blank; same limits as POST /rerank."""
    documents: list[VendorDocument] = Field(min_length=1, examples=[_DOCS])
    """Strings (objects as on /v1/rerank are accepted too); same limits as POST /rerank."""
    top_n: Count | None = None
    """Return only the best top_n results; unset = all."""
    max_tokens_per_doc: Count | None = None
    """Read at most this many tokens of each document; unset = as the strategy reads (Cohere cuts at 4096)."""
    return_documents: bool = False
    """Echo each result's document (sent by older clients; Cohere's v2 default: false)."""
    rank_fields: list[str] | None = None
    """As on /v1/rerank, for object documents."""
    priority: Integer | None = None
    """Cohere: accepted and ignored; every admitted request is served in arrival order."""
    max_chunks_per_doc: Count | None = None
    """Accepted and ignored; KEYRANK_MAX_WINDOWS_PER_DOC caps windows per document."""

    _query_not_blank = field_validator("query")(_non_blank)


class CohereRerankResponse(_Wire):
    """POST /v2/rerank answer."""

    id: str
    """The request id (also the X-Request-ID header)."""
    results: list[VendorResult]
    """Best first, cut to top_n."""
    meta: CohereMeta
    """API version and billing."""


# --------------------------------------------------------------------------- errors


class ErrorBody(_Wire):
    """What went wrong, readable by a person."""

    type: str = Field(examples=["invalid_request"])
    """Kind of error: invalid_request, invalid_json, limit_exceeded, body_too_large, unauthorized, not_found,
    overloaded, unavailable, internal."""
    message: str
    """What was wrong and, for a limit, the setting that sets it."""
    field: str | None = Field(None, examples=["documents[3]"])
    """The request field at fault."""
    request_id: str | None = None
    """Quote it when reporting a problem; it is in the server's log."""
    details: list[dict[str, Any]] | None = None
    """Every validation error, when there were several."""


class ErrorResponse(_Wire):
    """Every 4xx and 5xx answer of keyrank's own routes."""

    error: ErrorBody
    """What went wrong."""


class V1ErrorResponse(_Wire):
    """4xx/5xx of /v1/rerank: Jina clients read ``detail``, Cohere v1 clients ``message``."""

    detail: str
    """What went wrong (Jina's field)."""
    message: str
    """The same text (Cohere's field)."""
    error: ErrorBody
    """keyrank's structured error."""


class CohereErrorResponse(_Wire):
    """4xx/5xx of /v2/rerank in Cohere's shape."""

    id: str | None = None
    """The request id."""
    message: str
    """What went wrong (Cohere's field)."""
    error: ErrorBody
    """keyrank's structured error."""
