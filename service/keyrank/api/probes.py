"""Operations: liveness, readiness, Prometheus metrics. Open without the API key (no request content)."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from keyrank.api.errors import NATIVE_ERRORS, error_response
from keyrank.api.served import UNKNOWN, served_models
from keyrank.config import Settings

log = logging.getLogger("keyrank.api")

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness: the process answers.")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz", summary="Readiness: Triton is up and every served cross-encoder loaded.", responses={503: NATIVE_ERRORS[503]}
)
async def readyz(request: Request) -> Response:
    settings: Settings = request.app.state.settings
    rerankers = list((request.app.state.rerankers or {}).values()) or [request.app.state.reranker]
    try:
        # The probe itself must not hang on a dead Triton: bounded by the connect timeout. Every served model.
        ready = None not in rerankers and all(await asyncio.wait_for(
            asyncio.gather(*(r.ready() for r in rerankers)), settings.triton_connect_timeout_s))
    except Exception as exc:  # noqa: BLE001 -- timeout, connection refused, ...: all mean "not ready"
        log.info("readiness probe failed: %r", exc)
        ready = False
    if ready:
        return JSONResponse({"status": "ready"})
    retry = {"Retry-After": str(settings.retry_after_s)}
    return error_response(request, 503, "unavailable", "the scoring backend is not ready", headers=retry)


@router.get(
    "/metrics",
    summary="Prometheus metrics.",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text format."}},
)
async def prometheus_metrics(request: Request) -> Response:
    if UNKNOWN in getattr(request.app.state, "served", {}).values():
        await served_models(request.app)  # a model server that did not answer at startup: asked again
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
