"""POST /v1/rerank: Jina AI's shape, and Cohere's v1 shape that extends it (rank_fields, max_chunks_per_doc, object
documents; the documents, results and meta are Cohere's, cohere.py)."""

from __future__ import annotations

from pydantic import ConfigDict, Field, field_validator

from keyrank.schemas.cohere import CohereMeta, VendorDocument, VendorResult
from keyrank.schemas.common import (
    EXAMPLE_DOCS,
    EXAMPLE_QUERY,
    Count,
    VendorRequest,
    Wire,
    non_blank,
    query_field,
)
from keyrank.schemas.errors import ErrorBody


class V1RerankRequest(VendorRequest):
    """POST /v1/rerank: Jina AI's shape, which Cohere's v1 shape extends; both clients post here."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"model": "jina-reranker-v2-base-multilingual", "query": EXAMPLE_QUERY, "documents": EXAMPLE_DOCS, "top_n": 1}]
        }
    )

    model: str | None = None
    """With several models served (KEYRANK_MODELS) it picks one by name (GET /v1/models lists them); unset = the default, another name = 422 listing them. With one model served: accepted, and listed as ignored when it names another."""
    query: str = query_field()
    """The search query, non-blank; same limits as POST /rerank."""
    documents: list[VendorDocument] = Field(min_length=1, examples=[EXAMPLE_DOCS])
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
    """Cohere v1: the most windows scored per document by the windowed strategies (maxp, sump, avgp, parade-*),
    under KEYRANK_MAX_WINDOWS_PER_DOC: the best by BM25 against the query, in document order (KEYRANK_WINDOW_CAP_BY=first:
    the first ones); a cut is reported (``truncated``). Ignored when the strategy cuts no windows (keyb2, firstp)."""
    return_embeddings: bool | None = None
    """Jina: accepted and ignored; a cross-encoder has no document embeddings."""
    return_evidence: bool = False
    """keyrank's extension: add each result's evidence spans and coverage (evidence, truncated, read_tokens,
    document_tokens); clients that do not know these fields still parse the answer."""

    _query_not_blank = field_validator("query")(non_blank)


class JinaUsage(Wire):
    """Jina's usage block."""

    total_tokens: int
    """Tokens the cross-encoder read (keyrank's scored_tokens)."""


class V1RerankResponse(Wire):
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


class V1ErrorResponse(Wire):
    """4xx/5xx of /v1/rerank: Jina clients read ``detail``, Cohere v1 clients ``message``."""

    detail: str
    """What went wrong (Jina's field)."""
    message: str
    """The same text (Cohere's field)."""
    error: ErrorBody
    """keyrank's structured error."""
