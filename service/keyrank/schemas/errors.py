"""Error answers: keyrank's own shape and the vendors' (Jina reads ``detail``, Cohere ``message``, TEI ``error``,
Infinity's generated client FastAPI's ``detail`` list)."""

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


class TeiErrorResponse(Wire):
    """4xx/5xx of /tei/*, TEI's shape."""

    error: str
    """What went wrong (TEI's field)."""
    error_type: str
    """TEI's error kind: Validation (4xx from the request), Overloaded (429), Unhealthy (503), Backend (500)."""
    field: str | None = None
    """The request field at fault."""
    request_id: str | None = None
    """Quote it when reporting a problem; it is in the server's log."""


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
