"""`keyrank guard`: the model-path liveness of a Triton pod (Kubernetes sidecar).

Triton's own ``/v2/health/live`` stays 200 while its model cannot score (a
killed Python backend stub, a model unloaded, a wedged backend), so a
liveness probe on it never repairs anything. The guard runs beside Triton in
its pod and answers ``GET /v2/health/live`` on its own port with 200 only
while the model path really serves: Triton answers, the model is ready, and
a tiny real inference succeeds (every ``--probe-every`` seconds; a hang counts
after ``--hang-after`` seconds). The chart points Triton's liveness probe at
it, so the kubelet restarts Triton when the model path is broken, as the
embedded supervisor (supervision.py) does outside Kubernetes.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from keyrank.modelserver.admin import TritonAdmin
from keyrank.modelserver.supervision import HangClock

log = logging.getLogger("keyrank.modelserver.guard")


class ModelPathCheck(threading.Thread):
    """Checks Triton's model path every ``every_s``; ``verdict()`` is the latest answer."""

    def __init__(self, admin: TritonAdmin, model: str, *, every_s: float, probe_every_s: float,
                 probe_timeout_s: float, hang_after_s: float):
        super().__init__(name="keyrank-guard-check", daemon=True)
        self.admin = admin
        self.model = model
        self.every_s = every_s
        self.probe_every_s = probe_every_s
        self.probe_timeout_s = probe_timeout_s
        self.hang_after_s = hang_after_s
        self.stopping = threading.Event()
        self._fault: str | None = "not checked yet"
        self._probe_fault: str | None = None
        self._next_probe = 0.0
        self._hang = HangClock()

    def verdict(self) -> str | None:
        """None while the model path serves, else what is wrong."""
        return self._fault

    def run(self) -> None:
        while True:
            self._fault = self.check()
            if self.stopping.wait(self.every_s):
                return

    def check(self) -> str | None:
        if self.admin.server_id() is None:
            return "Triton does not answer"
        if not self.admin.model_ready(self.model):
            return f"model {self.model!r} is not ready"
        now = time.monotonic()
        if now >= self._next_probe:
            self._next_probe = now + self.probe_every_s
            self._probe_fault = self._probe()
        return self._probe_fault

    def _probe(self) -> str | None:
        error = self.admin.probe_inference(self.model, self.probe_timeout_s)
        if error == "timeout":  # a busy server queues the probe: only a run of them with no execution finishing is a hang
            self._hang.timed_out(time.monotonic() - self.probe_timeout_s, self.admin.execution_count(self.model))
            hung = time.monotonic() - self._hang.since
            return f"probe inference hung for {hung:.0f} s" if hung > self.hang_after_s else None
        self._hang.answered()
        if error is not None:
            log.error("probe inference failed: %s", error)
            return f"probe inference failed: {error}"
        return None


def _handler(check: ModelPathCheck) -> type[BaseHTTPRequestHandler]:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":  # the guard itself
                self._answer(200, {"status": "alive"})
            elif self.path == "/v2/health/live":
                fault = check.verdict()
                self._answer(200, {"status": "serving"}) if fault is None else self._answer(503, {"error": fault})
            else:
                self._answer(404, {"error": "not found"})

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            return

    return Health


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="keyrank guard", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--triton-http", default="http://127.0.0.1:8000", help="Triton's HTTP endpoint (same pod)")
    parser.add_argument("--model", default="cross_encoder", help="the model whose path is checked")
    parser.add_argument("--host", default="0.0.0.0", help="address the guard listens on (the kubelet probes the pod IP)")
    parser.add_argument("--port", type=int, default=8003, help="port of the guard's /v2/health/live and /healthz")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between checks of Triton and the model")
    parser.add_argument("--probe-every", type=float, default=2.0, help="seconds between probe inferences")
    parser.add_argument("--probe-timeout", type=float, default=10.0, help="timeout of one probe inference")
    parser.add_argument("--hang-after", type=float, default=30.0, help="seconds of timed-out probes that count as a hang")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check = ModelPathCheck(TritonAdmin(args.triton_http), args.model, every_s=args.every, probe_every_s=args.probe_every,
                           probe_timeout_s=args.probe_timeout, hang_after_s=args.hang_after)
    check.start()
    server = ThreadingHTTPServer((args.host, args.port), _handler(check))
    log.info("guarding %s model %r; liveness on http://%s:%d/v2/health/live", args.triton_http, args.model, args.host, args.port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        check.stopping.set()
        server.server_close()
    return 0
