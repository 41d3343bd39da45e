"""keyrank's own error answer; each vendor's error answer is with its other wire types (Jina reads ``detail``,
Cohere ``message``, TEI ``error``, Infinity's generated client FastAPI's ``detail`` list) and carries this
structured error too."""

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
    """The validation errors, when there were several: the first 20."""
    details_omitted: int | None = None
    """How many validation errors there were past the 20 in ``details``."""


class ErrorResponse(Wire):
    """Every 4xx and 5xx answer of keyrank's own routes."""

    error: ErrorBody
    """What went wrong."""
