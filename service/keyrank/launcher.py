"""`keyrank serve`: the gateway (uvicorn) and, unless told of an external one, an embedded Triton.

The embedded Triton is the tritonserver binary of the nvidia-pytriton wheel on
the generated CPU repository (models/triton-embedded). It is supervised: if it
dies it is restarted, and the gateway answers 503 meanwhile. SIGTERM / Ctrl-C
stop uvicorn first (draining in-flight requests), then Triton; Triton is also
tied to this process's life, so nothing is left behind.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import uvicorn

from keyrank.config import Settings
from keyrank.triton_server import EmbeddedTriton

log = logging.getLogger("keyrank.launcher")


class _Supervisor(threading.Thread):
    """Restarts the embedded Triton if it exits while the gateway runs."""

    def __init__(self, triton: EmbeddedTriton, interval_s: float = 2.0):
        super().__init__(name="triton-supervisor", daemon=True)
        self.triton = triton
        self.interval_s = interval_s
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            if self.triton.is_running():
                continue
            log.error("embedded Triton exited; restarting it (log: %s)", self.triton.log_path)
            try:
                self.triton.restart()
                log.info("embedded Triton is back at %s", self.triton.grpc_url)
            except Exception:  # keep supervising: the next tick tries again
                log.exception("embedded Triton failed to restart")


def _exit_cleanly(signum: int, frame: object) -> None:
    # uvicorn drains, then re-raises the SIGTERM it caught; with the default handler that would
    # kill this process before the `finally` below stops Triton. Exit through Python instead.
    raise SystemExit(0)


def serve(settings: Settings) -> None:
    """Run until SIGTERM / Ctrl-C."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _exit_cleanly)
    triton: EmbeddedTriton | None = None
    supervisor: _Supervisor | None = None
    try:
        if not settings.triton_url:
            triton = EmbeddedTriton(settings=settings).start()
            log.info("starting embedded Triton (CPU) on %s, log %s", triton.grpc_url, triton.log_path)
            waited = triton.wait_ready(settings.embedded_ready_timeout_s)
            log.info("embedded Triton ready in %.1f s", waited)
            settings = settings.with_overrides(triton_url=triton.grpc_url)
            supervisor = _Supervisor(triton)
            supervisor.start()
        print(f"keyrank serving on http://{settings.host}:{settings.port}  (docs: /docs, Triton: {settings.triton_url})", flush=True)
        if settings.workers > 1:
            # Workers are separate processes: they read their settings from the environment.
            os.environ["KEYRANK_TRITON_URL"] = str(settings.triton_url)
            os.environ["KEYRANK_MODEL_DIR"] = str(settings.model_dir)
            uvicorn.run(
                "keyrank.api:create_app", factory=True, host=settings.host, port=settings.port,
                workers=settings.workers, log_level="info", timeout_graceful_shutdown=10,
            )
        else:
            from keyrank.api import create_app

            config = uvicorn.Config(
                create_app(settings), host=settings.host, port=settings.port, log_level="info", timeout_graceful_shutdown=10
            )
            uvicorn.Server(config).run()
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has drained; fall through to stop Triton
        pass
    finally:
        if supervisor is not None:
            supervisor.stopping.set()
        if triton is not None:
            log.info("stopping embedded Triton")
            triton.stop()
