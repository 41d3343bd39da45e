"""Every error answer, in the shape of the dialect whose route was called, and the outcome it counts.

Each dialect's record (api/dialect.py, with the error answers' shapes and documentation) holds its error
shape, next to its routes: keyrank's own ``{"error": {type, message, field, request_id, details}}``
(``keyrank_error``, also the answer of the probes, the docs and unknown paths) or a vendor's, which carries
that structured error too where the vendor's clients leave room for it.

Messages name what the caller can fix; they never carry internal addresses, paths or stack traces
(those go to the log, with the request id). 429 and 503 carry ``Retry-After``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from keyrank import metrics
from keyrank.api.body import InvalidJson
from keyrank.api.dialect import documented_errors, keyrank_error
from keyrank.errors import (
    ClientClosed,
    InvalidRequest,
    LimitExceeded,
    Overloaded,
    ScoringUnavailable,
)
from keyrank.schemas import ErrorResponse

log = logging.getLogger("keyrank.api")

CLIENT_CLOSED = 499
"""nginx's status for a request whose client went away: logged and counted, never read by anyone."""
MAX_DETAILS = 20
"""Validation errors an answer lists in ``details``; the rest are counted (``details_omitted``). Listing
all of 8,000 unknown fields took 15 s on the event loop and answered 551 KB to a 95 KB body."""
MAX_FIELD_CHARS = 128
"""An echoed field name is cut to this many characters, ending in "...": unknown names are the caller's
text, of any length."""

_ERROR_TYPES = {
    400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 408: "body_timeout",
    413: "body_too_large", 415: "unsupported_encoding",
}
NATIVE_ERRORS = documented_errors(ErrorResponse)
"""keyrank's own error answers, for the OpenAPI ``responses`` of the routes outside every dialect (the probes)."""


def record(request: Request, outcome: str) -> None:
    """One count per rerank request; the strategy and model labels are '-' when the body never parsed (or
    named no served model)."""
    if request.url.path in request.app.state.dialects.rerank_paths:
        strategy = getattr(request.state, "strategy", "-")
        model = getattr(request.state, "model", "-")
        metrics.REQUESTS.labels(request.url.path, strategy, outcome, model).inc()


def error_response(
    request: Request,
    status: int,
    kind: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
    details: list[dict[str, Any]] | None = None,
    details_omitted: int = 0,
) -> JSONResponse:
    """The error answer in the shape of the dialect ``request``'s path belongs to (keyrank's own outside them)."""
    request_id = getattr(request.state, "request_id", None)
    error: dict[str, Any] = {"type": kind, "message": message, "request_id": request_id}
    if field is not None:
        error["field"] = field
    if details:
        error["details"] = details
    if details_omitted:
        error["details_omitted"] = details_omitted
    dialect = request.app.state.dialects.of(request.url.path)
    body = (dialect.error_body if dialect is not None else keyrank_error)(status, error)
    return JSONResponse(body, status_code=status, headers=headers)


def _field_name(loc: Sequence[Any]) -> str:
    """("body", "documents", 3, "DocumentIn", "text") -> "documents[3].text" (union member names dropped)."""
    name = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part in ("str", "bool", "int") or part[:1].isupper() or "[" in part:
            continue  # pydantic names the union member it tried; the caller never wrote it
        else:
            name += f".{part}" if name else part
    if len(name) > MAX_FIELD_CHARS:
        return name[: MAX_FIELD_CHARS - 3] + "..."
    return name or "body"


async def _parse_position(request: Request, loc: Sequence[Any]) -> str:
    """" at line L, column C" of the parse error (FastAPI gives the character offset), or ""."""
    offset = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    if offset is None:
        return ""
    try:
        text = (await request.body()).decode("utf-8", errors="replace")[:offset]
    except (RuntimeError, ClientDisconnect):  # the body stream is gone: the offset alone still helps
        return f" at character {offset}"
    line = text.count("\n") + 1
    return f" at line {line}, column {offset - (text.rfind(chr(10)) + 1) + 1}"


async def _validation_failed(request: Request, exc: RequestValidationError) -> JSONResponse:
    record(request, "invalid")
    errors = exc.errors()
    parse_errors = [e for e in errors if e["type"] == "json_invalid"]
    if parse_errors:
        reason = parse_errors[0].get("ctx", {}).get("error", "") or "cannot parse"
        where = await _parse_position(request, parse_errors[0]["loc"])
        return error_response(request, 400, "invalid_json", f"body is not valid JSON: {reason}{where}", field="body")
    details = []
    for e in errors[:MAX_DETAILS]:  # the rest are counted, never formatted
        field = _field_name(e["loc"])
        if e["type"] == "extra_forbidden":
            message = "unknown field"
        elif field == "body" and e["type"] == "missing":
            message = "a JSON object is required"
        elif field == "body":
            message = f"{e['msg']} (send a JSON object with Content-Type: application/json)"
        else:
            message = e["msg"]
        details.append({"field": field, "message": message, "type": e["type"]})
    # One readable line: the first message per field. A union fails once per member; when one
    # member got deeper (documents[0].text) its error is the one that says what is wrong.
    by_field: dict[str, list[str]] = {}
    for d in details:
        messages = by_field.setdefault(d["field"], [])
        if d["message"] not in messages:
            messages.append(d["message"])
    deepest = [f for f in by_field if not any(g != f and g.startswith((f + ".", f + "[")) for g in by_field)]
    summary = "; ".join(f"{f}: {', or '.join(by_field[f])}" for f in deepest[:3])
    # Errors of a body cut before validation (api/limits.py) were never built: counted all the same.
    omitted = len(errors) - len(details) + getattr(exc, "errors_not_built", 0)
    return error_response(request, 422, "invalid_request", summary, field=deepest[0], details=details,
                          details_omitted=omitted)


async def _invalid_json(request: Request, exc: InvalidJson) -> JSONResponse:
    record(request, "invalid")
    return error_response(request, 400, "invalid_json", f"body is not valid JSON: {exc}", field="body")


async def _invalid_request(request: Request, exc: InvalidRequest) -> JSONResponse:
    record(request, "invalid")
    kind = "limit_exceeded" if isinstance(exc, LimitExceeded) else "invalid_request"
    return error_response(request, 422, kind, str(exc), field=exc.field)


async def _overloaded(request: Request, exc: Overloaded) -> JSONResponse:
    record(request, "overloaded")
    return error_response(request, 429, "overloaded", str(exc), headers=retry_headers(request, exc.retry_after_s))


async def _unavailable(request: Request, exc: ScoringUnavailable) -> JSONResponse:
    record(request, "unavailable")
    # The cause (addresses, Triton's words) is for the operator's log, not for the caller.
    log.warning("scoring unavailable, request_id=%s: %s", getattr(request.state, "request_id", None), exc)
    retry_after = request.app.state.settings.retry_after_s
    message = f"scoring is unavailable (backend down, not ready or past the request deadline); retry after {retry_after} s"
    return error_response(request, 503, "unavailable", message, headers=retry_headers(request, retry_after))


def retry_headers(request: Request, seconds: int) -> dict[str, str]:
    """``Retry-After``, and ``Connection: close`` when the wait outlasts the keep-alive timeout: the server
    closes an idle connection after ``keep_alive_s``, and a client retrying on it would write into a closed one."""
    headers = {"Retry-After": str(seconds)}
    if seconds >= request.app.state.settings.keep_alive_s:
        headers["Connection"] = "close"
    return headers


async def _client_closed(request: Request, exc: ClientClosed) -> JSONResponse:
    record(request, "client_closed")
    log.info("client closed the request, request_id=%s; its work was cancelled", getattr(request.state, "request_id", None))
    return error_response(request, CLIENT_CLOSED, "client_closed", "client closed the request")


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    record(request, "error" if exc.status_code >= 500 else "invalid")
    kind = "internal" if exc.status_code >= 500 else _ERROR_TYPES.get(exc.status_code, "http_error")
    return error_response(request, exc.status_code, kind, str(exc.detail), headers=getattr(exc, "headers", None))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    request_id = getattr(request.state, "request_id", None)
    log.error("unhandled error, request_id=%s", request_id, exc_info=exc)
    record(request, "error")
    return error_response(request, 500, "internal", f"internal error (request id {request_id})")


def install_error_handlers(app: FastAPI) -> None:
    """Every exception the routes raise becomes one answer and one count."""
    app.add_exception_handler(RequestValidationError, _validation_failed)
    app.add_exception_handler(InvalidJson, _invalid_json)
    app.add_exception_handler(InvalidRequest, _invalid_request)
    app.add_exception_handler(Overloaded, _overloaded)
    app.add_exception_handler(ScoringUnavailable, _unavailable)
    app.add_exception_handler(ClientClosed, _client_closed)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
