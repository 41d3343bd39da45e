"""Error answers: keyrank's own shape and the vendors' (Jina reads ``detail``, Cohere ``message``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from keyrank.schemas.common import Wire


class ErrorBody(Wire):
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


class ErrorResponse(Wire):
    """Every 4xx and 5xx answer of keyrank's own routes."""

    error: ErrorBody
    """What went wrong."""


class V1ErrorResponse(Wire):
    """4xx/5xx of /v1/rerank: Jina clients read ``detail``, Cohere v1 clients ``message``."""

    detail: str
    """What went wrong (Jina's field)."""
    message: str
    """The same text (Cohere's field)."""
    error: ErrorBody
    """keyrank's structured error."""


class CohereErrorResponse(Wire):
    """4xx/5xx of /v2/rerank in Cohere's shape."""

    id: str | None = None
    """The request id."""
    message: str
    """What went wrong (Cohere's field)."""
    error: ErrorBody
    """keyrank's structured error."""
