"""michaelfeil/infinity: POST /infinity/rerank, GET /infinity/models, and the error answer its generated client
parses."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator

from keyrank.schemas.common import (
    EXAMPLE_DOCS,
    EXAMPLE_QUERY,
    Count,
    Coverage,
    VendorRequest,
    Wire,
    non_blank,
    query_field,
)
from keyrank.schemas.errors import ErrorBody


INFINITY_DEFAULT_MODEL = "default/not-specified"
"""What Infinity's clients send as ``model`` when the caller names none."""


class InfinityRerankRequest(VendorRequest):
    """POST /infinity/rerank: Infinity's rerank request, ranked with the default strategy and selector."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"model": "default/not-specified", "query": EXAMPLE_QUERY, "documents": EXAMPLE_DOCS}]})
    ignored_when_sent: ClassVar[frozenset[str]] = frozenset()
    unnamed_models: ClassVar[frozenset[str]] = frozenset({INFINITY_DEFAULT_MODEL})

    model: str = INFINITY_DEFAULT_MODEL
    """Infinity's default "default/not-specified" names none (the default model). With several models served (KEYRANK_MODELS) it picks one by name (GET /v1/models lists them); unset = the default, another name = 422 listing them. With one model
    served: listed as ignored when it names another."""
    query: str = query_field()
    """The search query, non-blank; same limits as POST /rerank."""
    documents: list[str] = Field(min_length=1, examples=[EXAMPLE_DOCS])
    """The documents (strings); same limits as POST /rerank."""
    return_documents: bool = False
    """Echo each result's document (a string, as Infinity does)."""
    raw_scores: bool = False
    """false (Infinity's default): the sigmoid of keyrank's score, in (0, 1); true: keyrank's score itself."""
    top_n: Count | None = None
    """Return only the best top_n results; unset = all."""
    return_evidence: bool = False
    """keyrank's extension: add each result's evidence spans and coverage (evidence, truncated, read_tokens,
    document_tokens); clients that do not know these fields still parse the answer."""

    _query_not_blank = field_validator("query")(non_blank)


class InfinityResult(Coverage):
    """One ranked document, Infinity's shape (plus keyrank's fields with return_evidence)."""

    relevance_score: float
    """sigmoid of keyrank's score, or the score itself with raw_scores."""
    index: int
    """Position of the document in the request."""
    document: str | None = None
    """The document; with return_documents."""


class InfinityUsage(Wire):
    """Infinity's usage block."""

    prompt_tokens: int
    """Tokens the cross-encoder read (keyrank's scored_tokens)."""
    total_tokens: int
    """The same count."""


class InfinityRerankResponse(Wire):
    """POST /infinity/rerank answer."""

    object: Literal["rerank"] = "rerank"
    """Always "rerank"."""
    results: list[InfinityResult]
    """Best first, cut to top_n."""
    model: str
    """The cross-encoder that scored the documents."""
    usage: InfinityUsage
    """Tokens read."""
    id: str
    """The request id (also the X-Request-ID header)."""
    created: int
    """Unix time of the answer."""


class InfinityModel(Wire):
    """One entry of GET /infinity/models."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="allow")

    id: str
    """The model's name, as answers report it."""
    object: Literal["model"] = "model"
    """Always "model"."""
    created: int
    """Unix time the model was prepared (its manifest was written)."""
    stats: dict[str, Any] = Field(default_factory=dict)
    """Infinity's queue statistics: none kept, empty."""
    backend: str = "triton"
    """Where the model runs."""
    capabilities: list[str] = Field(default_factory=lambda: ["rerank"])
    """What the model does here."""


class InfinityModels(Wire):
    """GET /infinity/models: the served models, Infinity's shape."""

    data: list[InfinityModel]
    """One entry per served model."""
    object: Literal["list"] = "list"
    """Always "list"."""


class ValidationDetail(Wire):
    """One entry of FastAPI's validation error list."""

    loc: list[str | int]
    """Where: "body" and the field's path."""
    msg: str
    """What was wrong."""
    type: str
    """keyrank's error kind."""


class InfinityErrorResponse(Wire):
    """4xx/5xx of /infinity/*: FastAPI's ``detail`` list (what Infinity's generated client parses), and keyrank's error."""

    detail: list[ValidationDetail]
    """One entry naming the field at fault ("body" when none)."""
    message: str
    """What went wrong."""
    error: ErrorBody
    """keyrank's structured error."""
