"""Cohere's shapes: POST /v2/rerank, and what its v1 shape (POST /v1/rerank, jina.py) shares with it: object
documents, results and the meta block."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator

from keyrank.schemas.common import (
    EXAMPLE_DOCS,
    EXAMPLE_QUERY,
    Count,
    Coverage,
    Integer,
    VendorRequest,
    Wire,
    non_blank,
    query_field,
)
from keyrank.schemas.errors import ErrorBody


_VENDOR_OBJECT_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string", "description": "The document text."}},
    "required": ["text"],
    "description": "An object document: its `text` is read; with rank_fields, those fields are read instead "
    "(Cohere v1), and then `text` may be absent.",
}
VendorDocument = str | Annotated[dict[str, Any], WithJsonSchema(_VENDOR_OBJECT_SCHEMA)]
"""A string, or an object: its ``text`` field is read, or the ``rank_fields`` as "field: value" lines."""


class VendorDocumentOut(Wire):
    """The document as sent: {"text": ...} for a string; an object is echoed as it came."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="allow")

    text: str | None = None
    """The document text (for a string document)."""


class VendorResult(Coverage):
    """One ranked document, Jina/Cohere shape."""

    index: int
    """Position of the document in the request."""
    relevance_score: float
    """sigmoid of keyrank's score: in (0, 1) as Jina and Cohere clients expect, same order."""
    document: VendorDocumentOut | None = None
    """The document; with return_documents."""


class CohereApiVersion(Wire):
    """Cohere's api_version block."""

    version: Literal["1", "2"] = "2"
    """The Cohere API version of the route: "1" on /v1/rerank, "2" on /v2/rerank."""


class CohereBilledUnits(Wire):
    """Cohere's billing block."""

    search_units: int
    """One per started 100 documents, as Cohere counts a search unit."""


class CohereMeta(Wire):
    """Cohere's meta block."""

    api_version: CohereApiVersion
    """Version of the Cohere shape."""
    billed_units: CohereBilledUnits
    """Search units of the request."""


class CohereRerankRequest(VendorRequest):
    """POST /v2/rerank in Cohere's v2 shape, ranked with the default strategy and selector."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"model": "rerank-v3.5", "query": EXAMPLE_QUERY, "documents": EXAMPLE_DOCS, "top_n": 1}]}
    )

    model: str
    """Required by Cohere's API. With several models served (KEYRANK_MODELS) it picks one by name (GET /v1/models lists them); unset = the default, another name = 422 listing them. With one model served: listed as ignored when it names another."""
    query: str = query_field()
    """The search query, non-blank; same limits as POST /rerank."""
    documents: list[VendorDocument] = Field(min_length=1, examples=[EXAMPLE_DOCS])
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
    """The most windows scored per document by the windowed strategies (maxp, sump, avgp, parade-*),
    under KEYRANK_MAX_WINDOWS_PER_DOC: the best by BM25 against the query, in document order (KEYRANK_WINDOW_CAP_BY=first:
    the first ones); a cut is reported (``truncated``). Ignored when the strategy cuts no windows (keyb2, firstp)."""
    return_evidence: bool = False
    """keyrank's extension: add each result's evidence spans and coverage (evidence, truncated, read_tokens,
    document_tokens); clients that do not know these fields still parse the answer."""

    _query_not_blank = field_validator("query")(non_blank)


class CohereRerankResponse(Wire):
    """POST /v2/rerank answer."""

    id: str
    """The request id (also the X-Request-ID header)."""
    results: list[VendorResult]
    """Best first, cut to top_n."""
    meta: CohereMeta
    """API version and billing."""


class CohereErrorResponse(Wire):
    """4xx/5xx of /v2/rerank in Cohere's shape."""

    id: str | None = None
    """The request id."""
    message: str
    """What went wrong (Cohere's field)."""
    error: ErrorBody
    """keyrank's structured error."""
