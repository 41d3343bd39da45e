"""`keyrank serve`: the gateway (uvicorn) and, unless told of an external one, an embedded Triton.

The embedded Triton is the tritonserver binary of the nvidia-pytriton wheel on
the generated CPU repository (models/triton-embedded), on free loopback ports;
with several models (KEYRANK_MODELS) on one repository in its work dir holding
each under its name, all loaded and watched.
It supervises itself (supervision.py): a dead model process is unloaded and
loaded again, a dead server restarted, and the gateway answers 503 meanwhile;
past a bounded number of repairs `serve` stops and exits non-zero, saying why.
SIGTERM / Ctrl-C stop uvicorn first (draining in-flight requests), then Triton;
Triton is also tied to this process's life, so nothing is left behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import Any

import uvicorn
from starlette.requests import Request

from keyrank.api.http_protocol import HTTP_PROTOCOL, protocol_with_timeout
from keyrank.config import Settings
from keyrank.errors import KeyrankError
from keyrank.modelserver.embedded import EmbeddedTriton
from keyrank.pipeline import check_served_defaults

log = logging.getLogger("keyrank.modelserver.launcher")


class _GiveUp:
    """Set by the supervisor when it gives up; stops the gateway through the usual SIGTERM path."""

    def __init__(self) -> None:
        self.reason: str | None = None
        """What the supervisor said when it gave up."""

    def __call__(self, reason: str) -> None:
        self.reason = reason
        os.kill(os.getpid(), signal.SIGTERM)


class AnswerCutRequests:
    """ASGI wrapper: a request still running when the shutdown grace (``shutdown_grace_s``) ends is
    cancelled by uvicorn, which then answered a plain-text 500; it gets the documented JSON 503 with
    Retry-After instead, so the client retries elsewhere."""

    def __init__(self, app: Any, retry_after_s: int) -> None:
        self.app = app
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if started:
                raise
            from keyrank.api.errors import error_response

            response = error_response(
                Request(scope), 503, "unavailable", "the server is shutting down: retry the request",
                headers={"Retry-After": str(self.retry_after_s)},
            )
            await response(scope, receive, send)


def create_served_app() -> AnswerCutRequests:
    """The app each uvicorn worker serves (``KEYRANK_WORKERS`` > 1 imports it by name)."""
    from keyrank.api import create_app
    from keyrank.config import get_settings

    return AnswerCutRequests(create_app(), get_settings().retry_after_s)


def _exit_cleanly(signum: int, frame: object) -> None:
    # uvicorn drains, then re-raises the SIGTERM it caught; with the default handler that would
    # kill this process before the `finally` below stops Triton. Exit through Python instead.
    raise SystemExit(0)


def _phase(message: str) -> None:
    print(f"keyrank serve: {message}", flush=True)


def serve(settings: Settings) -> int:
    """Run until SIGTERM / Ctrl-C (0), or until the embedded Triton cannot be kept serving (1)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _exit_cleanly)
    triton: EmbeddedTriton | None = None
    gave_up = _GiveUp()
    try:
        # A malformed KEYRANK_MODELS, or a default strategy or selector a model cannot serve (longp on a 512-token
        # model), is named before anything starts.
        check_served_defaults(settings)
    except ValueError as exc:
        print(f"keyrank serve: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        if not settings.triton_url:
            try:
                triton = EmbeddedTriton(settings=settings, on_give_up=gave_up)
                _phase(f"starting embedded Triton (CPU) on {triton.grpc_url}, log {triton.log_path}")
                waited = triton.start().wait_ready(settings.embedded_ready_timeout_s)
            except KeyrankError as exc:
                print(f"keyrank serve: cannot start the embedded Triton: {exc}", file=sys.stderr, flush=True)
                return 1
            _phase(f"embedded Triton {triton.server_id} ready in {waited:.1f} s (supervised), serving {', '.join(triton.models)}")
            settings = settings.with_overrides(triton_url=triton.grpc_url, triton_server_id=triton.server_id)
        _phase(f"gateway on http://{settings.host}:{settings.port}  (docs: /docs, Triton: {settings.triton_url})")
        if settings.workers > 1:
            # Workers are separate processes: they read their settings from the environment.
            os.environ["KEYRANK_TRITON_URL"] = str(settings.triton_url)
            if settings.triton_server_id:
                os.environ["KEYRANK_TRITON_SERVER_ID"] = settings.triton_server_id
            os.environ["KEYRANK_MODEL_DIR"] = str(settings.model_dir)
            os.environ["KEYRANK_WORKERS"] = str(settings.workers)  # each worker's share of the cores (tokenize_word_cache)
            for name, value in (("KEYRANK_MODELS", settings.models), ("KEYRANK_DEFAULT_MODEL", settings.default_model)):
                if value:
                    os.environ[name] = value
            os.environ["KEYRANK_HEADER_READ_TIMEOUT_S"] = str(settings.header_read_timeout_s)
            os.environ["KEYRANK_KEEP_ALIVE_S"] = str(settings.keep_alive_s)  # the workers' 429s/503s close past it
            uvicorn.run(
                "keyrank.modelserver.launcher:create_served_app", factory=True, host=settings.host, port=settings.port,
                workers=settings.workers, log_level="info", timeout_graceful_shutdown=settings.shutdown_grace_s,
                timeout_keep_alive=settings.keep_alive_s,
                http=HTTP_PROTOCOL,
            )
        else:
            from keyrank.api import create_app

            config = uvicorn.Config(
                AnswerCutRequests(create_app(settings), settings.retry_after_s), host=settings.host, port=settings.port,
                log_level="info", timeout_graceful_shutdown=settings.shutdown_grace_s,
                timeout_keep_alive=settings.keep_alive_s, http=protocol_with_timeout(settings.header_read_timeout_s),
            )
            uvicorn.Server(config).run()
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has drained; fall through to stop Triton
        pass
    except SystemExit as exc:  # our SIGTERM handler; anything else is re-raised
        if exc.code not in (0, None):
            raise
    finally:
        if triton is not None:
            log.info("stopping embedded Triton")
            triton.close()
    if gave_up.reason is not None:
        print(f"keyrank serve: stopped: {gave_up.reason}", file=sys.stderr, flush=True)
        return 1
    return 0
