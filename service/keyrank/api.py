"""HTTP layer: a thin shell over ``Reranker.arank``; it knows nothing about models.

Routes parse (schemas.py), call the reranker, shape the answer. Around them:
- request ids: ``X-Request-ID`` echoed, or generated, on every answer;
- body limit: ``KEYRANK_MAX_BODY_BYTES`` -> 413 before any parsing (Content-Length,
  and the streamed size for chunked bodies);
- optional API key: when ``KEYRANK_API_KEY`` is set, the rerank routes need
  ``Authorization: Bearer <key>``. The probes (/healthz, /readyz), /metrics and the
  OpenAPI pages stay open: kubelets and Prometheus scrape them from inside the
  cluster and they carry no request content;
- errors: every 4xx/5xx is ``{"error": {type, message, field, request_id}}``;
  a 500 never carries a stack trace (it is logged with the request id).

Run: ``uvicorn keyrank.api:create_app --factory``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import re
import secrets
import uuid
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keyrank import metrics
from keyrank.config import Settings, get_settings
from keyrank.errors import InvalidRequest, ScoringUnavailable
from keyrank.schemas import (
    CohereBilledUnits,
    CohereMeta,
    CohereRerankRequest,
    CohereRerankResponse,
    CohereResult,
    DocumentOut,
    ErrorResponse,
    EvidenceOut,
    JinaRerankRequest,
    JinaRerankResponse,
    JinaResult,
    JinaUsage,
    LimitExceeded,
    RerankRequest,
    RerankResponse,
    RerankResult,
    TimingsOut,
    UsageOut,
    check_limits,
)

if TYPE_CHECKING:
    from keyrank.reranker import RankedDocument, Ranking, Reranker

log = logging.getLogger("keyrank.api")

RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")
_REQUEST_ID = re.compile(r"^[\w.:@/+=-]{1,128}$")  # echo only ids that are safe to log and to put in a header
_ERROR_TYPES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "Body is not JSON.",
        401: "Missing or wrong API key (only when KEYRANK_API_KEY is set).",
        413: "Body larger than KEYRANK_MAX_BODY_BYTES.",
        422: "Invalid field or a configured limit exceeded; the message names it.",
        503: "Triton down, not ready or past the deadline; retry after Retry-After seconds.",
    }.items()
}


# --------------------------------------------------------------------------- the app


def create_app(settings: Settings | None = None, reranker: Reranker | None = None) -> FastAPI:
    """The gateway. Without ``reranker`` the lifespan builds one from ``settings`` and closes it;
    a reranker passed in belongs to the caller and is left open."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if reranker is not None:
            yield
            return
        from keyrank.reranker import (
            Reranker,  # the pipeline's imports stay out of `import keyrank.api`
        )

        app.state.reranker = Reranker(settings)
        try:
            yield
        finally:
            await app.state.reranker.aclose()

    app = FastAPI(
        title="keyrank",
        summary="Re-ranking for long documents: key blocks (KeyB2), MaxP and PARADE on a Triton cross-encoder.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.reranker = reranker
    # add_middleware wraps from the outside in: the request id is set before the body limit can answer.
    app.add_middleware(BodyLimit, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(RequestId)
    app.add_exception_handler(RequestValidationError, _validation_failed)
    app.add_exception_handler(InvalidRequest, _invalid_request)
    app.add_exception_handler(ScoringUnavailable, _unavailable)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    app.include_router(probes)
    app.include_router(rerank_routes, dependencies=[Depends(require_api_key)])
    return app


# --------------------------------------------------------------------------- middleware


class RequestId:
    """Gives every request an id (the caller's ``X-Request-ID`` if sane) and echoes it."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)


class BodyLimit:
    """413 for bodies over ``max_body_bytes``, before FastAPI parses (or even buffers) them."""

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.limit = max_body_bytes

    def _too_large(self, size: str) -> str:
        return f"request body of {size} bytes exceeds the limit of {self.limit} (KEYRANK_MAX_BODY_BYTES)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            request = Request(scope)
            _record(request, "invalid")
            response = _error(request, 413, "body_too_large", self._too_large(declared.decode()))
            return await response(scope, receive, send)
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    # Raised inside FastAPI's body read, which re-raises HTTPException to our handler.
                    raise HTTPException(413, self._too_large(f"more than {self.limit}"))
            return message

        await self.app(scope, counted_receive, send)


# --------------------------------------------------------------------------- auth

_bearer = HTTPBearer(auto_error=False, description="Needed only when KEYRANK_API_KEY is set.")


Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def require_api_key(request: Request, credentials: Credentials) -> None:
    """401 unless the Bearer token equals KEYRANK_API_KEY (when one is configured)."""
    key = request.app.state.settings.api_key
    if key is None:
        return
    if credentials is None:
        raise HTTPException(401, "missing API key: send Authorization: Bearer <key>", {"WWW-Authenticate": "Bearer"})
    if not secrets.compare_digest(credentials.credentials.encode(), key.get_secret_value().encode()):
        raise HTTPException(401, "invalid API key", {"WWW-Authenticate": 'Bearer error="invalid_token"'})


# --------------------------------------------------------------------------- probes and metrics

probes = APIRouter(tags=["operations"])


@probes.get("/healthz", summary="Liveness: the process answers.")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@probes.get("/readyz", summary="Readiness: Triton is up and the cross-encoder loaded.", responses={503: _ERRORS[503]})
async def readyz(request: Request) -> Response:
    settings: Settings = request.app.state.settings
    reranker = request.app.state.reranker
    try:
        # The probe itself must not hang on a dead Triton: bounded by the connect timeout.
        ready = reranker is not None and await asyncio.wait_for(reranker.ready(), settings.triton_connect_timeout_s)
    except Exception as exc:  # timeout, connection refused, ...: all mean "not ready"
        log.info("readiness probe failed: %r", exc)
        ready = False
    if ready:
        return JSONResponse({"status": "ready"})
    return _error(request, 503, "unavailable", "Triton or the cross-encoder is not ready")


@probes.get("/metrics", summary="Prometheus metrics.", response_class=Response)
async def prometheus_metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


# --------------------------------------------------------------------------- rerank routes

rerank_routes = APIRouter(tags=["rerank"], responses=_ERRORS)


@rerank_routes.post("/rerank", response_model=RerankResponse, summary="Rank documents; keyrank's own shape.")
async def rerank(body: RerankRequest, request: Request) -> Response:
    texts = body.texts()
    ranking = await _rank(
        request,
        body.query,
        texts,
        strategy=body.strategy,
        selector=body.selector,
        top_n=body.top_n,
        max_tokens_per_doc=body.max_tokens_per_doc,
    )
    ids = body.ids()
    results = [_result(r, texts[r.index], ids[r.index], body) for r in ranking.results]
    answer = RerankResponse(
        model=ranking.model,
        strategy=ranking.strategy,
        selector=ranking.selector,
        results=results,
        usage=UsageOut(**dataclasses.asdict(ranking.usage)),
        timings_ms=TimingsOut(**ranking.timings_ms),
    )
    content = answer.model_dump(mode="json", exclude_none=True)
    content["selector"] = ranking.selector  # null for non-keyb2 strategies, but always present
    return JSONResponse(content, headers=_timing_header(ranking))


def _result(ranked: RankedDocument, text: str, doc_id: str | None, body: RerankRequest) -> RerankResult:
    evidence = None
    if body.return_evidence:
        evidence = [
            EvidenceOut(start=e.start, end=e.end, text=text[e.start : e.end] if body.return_documents else None)
            for e in ranked.evidence
        ]
    return RerankResult(
        index=ranked.index,
        id=doc_id,
        relevance_score=ranked.score,
        evidence=evidence,
        document=DocumentOut(text=text) if body.return_documents else None,
        truncated=ranked.truncated,
    )


@rerank_routes.post("/v1/rerank", response_model=JinaRerankResponse, summary="Jina AI rerank shape.")
async def rerank_jina(body: JinaRerankRequest, request: Request) -> Response:
    texts = body.texts()
    ranking = await _rank(request, body.query, texts, top_n=body.top_n)
    answer = JinaRerankResponse(
        model=ranking.model,
        usage=JinaUsage(total_tokens=ranking.usage.scored_tokens),
        results=[
            JinaResult(
                index=r.index,
                relevance_score=_sigmoid(r.score),
                document=DocumentOut(text=texts[r.index]) if body.return_documents else None,
            )
            for r in ranking.results
        ],
    )
    return JSONResponse(answer.model_dump(mode="json", exclude_none=True), headers=_timing_header(ranking))


@rerank_routes.post("/v2/rerank", response_model=CohereRerankResponse, summary="Cohere v2 rerank shape.")
async def rerank_cohere(body: CohereRerankRequest, request: Request) -> Response:
    ranking = await _rank(request, body.query, body.documents, top_n=body.top_n, max_tokens_per_doc=body.max_tokens_per_doc)
    answer = CohereRerankResponse(
        id=request.state.request_id,
        results=[CohereResult(index=r.index, relevance_score=_sigmoid(r.score)) for r in ranking.results],
        # Cohere bills one search unit per query and started 100 documents.
        meta=CohereMeta(billed_units=CohereBilledUnits(search_units=max(1, math.ceil(len(body.documents) / 100)))),
    )
    return JSONResponse(answer.model_dump(mode="json"), headers=_timing_header(ranking))


async def _rank(request: Request, query: str, texts: Sequence[str], **options: Any) -> Ranking:
    """Limits, then the pipeline; records the outcome of every rerank request exactly once."""
    settings: Settings = request.app.state.settings
    request.state.strategy = options.get("strategy") or settings.default_strategy
    check_limits(query, list(texts), settings)
    if await request.is_disconnected():
        # The client has gone: scoring for nobody would only delay the others (TEI drops these too).
        raise HTTPException(499, "client closed the request")
    try:
        with metrics.IN_FLIGHT.track_inprogress():
            ranking = await request.app.state.reranker.arank(query, texts, **options)
    except (InvalidRequest, ScoringUnavailable):
        raise
    except Exception:
        log.exception("rerank failed, request_id=%s", request.state.request_id)
        raise HTTPException(500, "internal error") from None
    request.state.strategy = ranking.strategy
    _record(request, "ok")
    return ranking


def _timing_header(ranking: Ranking) -> dict[str, str]:
    return {"Server-Timing": ", ".join(f"{stage};dur={ms:.3f}" for stage, ms in ranking.timings_ms.items())}


def _sigmoid(score: float) -> float:
    """Maps the logit into (0, 1) as Jina and Cohere clients expect; the order is unchanged."""
    return 0.5 * (1.0 + math.tanh(0.5 * score))


# --------------------------------------------------------------------------- errors


def _record(request: Request, outcome: str) -> None:
    """One count per rerank request; the strategy label is '-' when the body never parsed."""
    if request.url.path in RERANK_PATHS:
        strategy = getattr(request.state, "strategy", "-")
        metrics.REQUESTS.labels(request.url.path, strategy, outcome).inc()


def _error(
    request: Request,
    status: int,
    kind: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
    details: list[dict[str, Any]] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"type": kind, "message": message, "request_id": getattr(request.state, "request_id", None)}
    if field is not None:
        body["field"] = field
    if details:
        body["details"] = details
    if status == 503:
        headers = {**(headers or {}), "Retry-After": str(request.app.state.settings.retry_after_s)}
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def _field_name(loc: Sequence[Any]) -> str:
    """("body", "documents", 3, "DocumentIn", "text") -> "documents[3].text" (union member names dropped)."""
    name = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part == "str" or part[:1].isupper() or "[" in part:
            continue  # pydantic names the union member it tried; the caller never wrote it
        else:
            name += f".{part}" if name else part
    return name or "body"


async def _validation_failed(request: Request, exc: RequestValidationError) -> JSONResponse:
    _record(request, "invalid")
    errors = exc.errors()
    if any(e["type"] == "json_invalid" for e in errors):
        reason = next(e.get("ctx", {}).get("error", "") for e in errors if e["type"] == "json_invalid")
        return _error(request, 400, "invalid_json", f"body is not valid JSON: {reason}".rstrip(": "), field="body")
    details = []
    for e in errors:
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
    return _error(request, 422, "invalid_request", summary, field=deepest[0], details=details)


async def _invalid_request(request: Request, exc: InvalidRequest) -> JSONResponse:
    _record(request, "invalid")
    kind = "limit_exceeded" if isinstance(exc, LimitExceeded) else "invalid_request"
    return _error(request, 422, kind, str(exc), field=exc.field)


async def _unavailable(request: Request, exc: ScoringUnavailable) -> JSONResponse:
    _record(request, "unavailable")
    log.warning("scoring unavailable, request_id=%s: %s", getattr(request.state, "request_id", None), exc)
    return _error(request, 503, "unavailable", f"scoring unavailable: {exc}")


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    _record(request, "error" if exc.status_code >= 500 else "invalid")
    kind = "internal" if exc.status_code >= 500 else _ERROR_TYPES.get(exc.status_code, "http_error")
    return _error(request, exc.status_code, kind, str(exc.detail), headers=getattr(exc, "headers", None))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    request_id = getattr(request.state, "request_id", None)
    log.error("unhandled error, request_id=%s", request_id, exc_info=exc)
    _record(request, "error")
    return _error(request, 500, "internal", f"internal error (request id {request_id})")
