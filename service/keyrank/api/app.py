"""The app factory: settings, the reranker's lifetime, the admission queue, middleware, the dialects' routes, docs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from keyrank.admission import AdmissionQueue
from keyrank.api.dialect import Dialect, Dialects
from keyrank.api.docs import mount_docs
from keyrank.api.errors import install_error_handlers
from keyrank.api.limits import openapi_limits
from keyrank.api.middleware import ApiKeyGate, BodyLimit, CloseUnreadBody, RequestId
from keyrank.api.playground import install as install_playground
from keyrank.api.probes import router as probes
from keyrank.api.routes import cohere, infinity, jina, native, openai, served_names, tei
from keyrank.api.served import served_models
from keyrank.blank import warm_up
from keyrank.config import Settings, get_settings, serving_warnings
from keyrank.reranker import Reranker

SUMMARY = "Re-ranking for long documents: key blocks (KeyB2), MaxP and PARADE on a Triton cross-encoder."
log = logging.getLogger("keyrank.api")
DIALECTS: tuple[Dialect, ...] = (native.DIALECT, jina.DIALECT, cohere.DIALECT, tei.DIALECT, infinity.DIALECT, openai.DIALECT)
"""The client dialects the gateway speaks, in the order their routes are mounted and listed on the OpenAPI page."""


def create_app(
    settings: Settings | None = None, reranker: Reranker | None = None, rerankers: dict[str, Reranker] | None = None
) -> FastAPI:
    """The gateway. Without ``reranker`` the lifespan builds one from ``settings`` and closes it, or one per
    model when ``settings.models`` names several (``rerankers``: {name: Reranker}, the default first); rerankers
    passed in (or put on ``app.state`` before start) belong to the caller and are left open."""
    settings = settings or get_settings()
    served = settings.served_models()  # a malformed KEYRANK_MODELS fails here, naming the setting

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        warm_up()  # the blank-document pattern over all of Unicode: built here, not by the first request
        for folder in [settings.for_model(n, f) for n, f in served.items()] or [settings]:
            for warning in serving_warnings(folder):  # finetune measured the model it started from reading better
                log.warning("%s", warning)
        if app.state.reranker is not None:
            await served_models(app)  # keyrank_model_info: what scores each model
            yield
            return
        if served:
            built = {name: Reranker(settings.for_model(name, folder)) for name, folder in served.items()}
        else:
            built = {"": Reranker(settings)}
        app.state.rerankers = built if served else None
        app.state.reranker = next(iter(built.values()))
        await served_models(app)  # keyrank_model_info (an external Triton is asked within its connect timeout)
        try:
            yield
        finally:
            for each in built.values():
                await each.aclose()
            app.state.reranker = app.state.rerankers = None

    app = FastAPI(title="keyrank", summary=SUMMARY, version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    # {name: Reranker} when several models are served (a request's ``model`` picks one), else None;
    # app.state.reranker is the default model's.
    app.state.rerankers = dict(rerankers) if rerankers else None
    app.state.reranker = reranker or (next(iter(rerankers.values())) if rerankers else None)
    app.state.admission = AdmissionQueue(settings)
    # errors.py answers in the shape of the dialect a path belongs to.
    app.state.dialects = dialects = Dialects(DIALECTS)
    # add_middleware wraps from the outside in: the request id is set before the key and the size are checked,
    # and every refusal of theirs is seen by CloseUnreadBody.
    app.add_middleware(BodyLimit, max_body_bytes=settings.max_body_bytes, read_timeout_s=settings.body_read_timeout_s)
    app.add_middleware(ApiKeyGate, api_key=settings.api_key, paths=dialects.rerank_paths)
    app.add_middleware(CloseUnreadBody)
    app.add_middleware(RequestId)
    install_error_handlers(app)
    app.include_router(probes)
    for dialect in dialects.all:
        app.include_router(dialect.router, prefix=dialect.prefix)
    mount_docs(app)
    install_playground(app)  # GET /playground unless KEYRANK_PLAYGROUND=false
    app.openapi = lambda: _openapi(app, settings)  # type: ignore[method-assign]
    return app


def _openapi_models(schema: dict[str, Any], dialects: Sequence[Dialect], names: list[str], several: bool) -> None:
    """With several models served, their names as the enum of each dialect's request ``model`` (Infinity's
    placeholder included); with one, any name is accepted (another is named as ignored)."""
    if not several:
        return
    for dialect in dialects:
        if dialect.request is None or "model" not in dialect.request.model_fields:
            continue
        field = schema["components"]["schemas"][dialect.request.__name__]["properties"]["model"]
        allowed = names + [field["default"]] if isinstance(field.get("default"), str) else names
        for branch in field.get("anyOf", [field]):
            if branch.get("type") == "string":
                branch["enum"] = list(allowed)


def _openapi(app: FastAPI, settings: Settings) -> dict[str, Any]:
    """FastAPI's schema, plus the configured limits (maxItems/maxLength) and the optional Bearer key."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        dialects: Dialects = app.state.dialects
        openapi_limits(schema, settings, dialects.all)
        _openapi_models(schema, dialects.all, served_names(app), several=bool(app.state.rerankers))
        if settings.api_key is not None:
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer", "description": "KEYRANK_API_KEY"}
            }
            for path in dialects.rerank_paths:
                schema["paths"][path]["post"]["security"] = [{"bearer": []}]
        app.openapi_schema = schema
    return app.openapi_schema
