"""`keyrank guard`: the model-path liveness of a Triton pod (Kubernetes sidecar).

Triton's own ``/v2/health/live`` stays 200 while its model cannot score (a
killed Python backend stub, a model unloaded, a wedged backend), so a
liveness probe on it never repairs anything. The guard runs beside Triton in
its pod and answers ``GET /v2/health/live`` on its own port with 200 only
while the model path really serves: Triton answers, the model and the
interaction graphs beside it are ready, and a tiny real inference of each
succeeds (every ``--probe-every`` seconds; a hang counts after
``--hang-after`` seconds). The chart points Triton's liveness probe at
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
from keyrank.modelserver.repository import GRAPH_INPUTS
from keyrank.modelserver.supervision import HangClock

log = logging.getLogger("keyrank.modelserver.guard")


class ModelPathCheck(threading.Thread):
    """Checks Triton's model path every ``every_s``; ``verdict()`` is the latest answer.

    The path is ``model`` and, with ``graphs``, the interaction graphs Triton serves beside it (CEDR, Model 1:
    the models of its repository index whose metadata declares ``token_roles``): a strategy is served only
    while its graph is, so a graph that cannot score fails liveness as the cross-encoder does.
    """

    def __init__(self, admin: TritonAdmin, model: str, *, every_s: float, probe_every_s: float,
                 probe_timeout_s: float, hang_after_s: float, graphs: bool = True):
        super().__init__(name="keyrank-guard-check", daemon=True)
        self.admin = admin
        self.model = model
        self.graphs = graphs
        self.every_s = every_s
        self.probe_every_s = probe_every_s
        self.probe_timeout_s = probe_timeout_s
        self.hang_after_s = hang_after_s
        self.stopping = threading.Event()
        self._fault: str | None = "not checked yet"
        self._probe_fault: str | None = None
        self._next_probe = 0.0
        self._hangs: dict[str, HangClock] = {}
        self._is_graph: dict[str, bool] = {}  # what each model's metadata said, read once while it was ready

    def verdict(self) -> str | None:
        """None while the model path serves, else what is wrong."""
        return self._fault

    def run(self) -> None:
        while True:
            self._fault = self.check()
            if self.stopping.wait(self.every_s):
                return

    def watched(self) -> list[str]:
        """``model``, then the interaction graphs in Triton's repository index (none if it cannot be read)."""
        found = [self.model]
        for name, state in (self.admin.repository_index() or []) if self.graphs else []:
            if name != self.model and name not in self._is_graph and state == "READY":
                inputs = self.admin.model_inputs(name)
                if inputs is not None:
                    self._is_graph[name] = GRAPH_INPUTS[-1] in inputs
            if name != self.model and self._is_graph.get(name):
                found.append(name)
        return found

    def check(self) -> str | None:
        if self.admin.server_id() is None:
            return "Triton does not answer"
        watched = self.watched()
        for model in watched:
            if not self.admin.model_ready(model):
                return f"model {model!r} is not ready"
        now = time.monotonic()
        if now >= self._next_probe:
            self._next_probe = now + self.probe_every_s
            self._probe_fault = None
            for model in watched:
                self._probe_fault = self._probe_fault or self._probe(model)
        return self._probe_fault

    def _probe(self, model: str) -> str | None:
        error = self.admin.probe_inference(model, self.probe_timeout_s, graph=model != self.model)
        which = "" if model == self.model else f" of {model!r}"
        hang = self._hangs.setdefault(model, HangClock())
        if error == "timeout":  # a busy server queues the probe: only a run of them with no execution finishing is a hang
            hang.timed_out(time.monotonic() - self.probe_timeout_s, self.admin.execution_count(model))
            hung = time.monotonic() - hang.since
            return f"probe inference{which} hung for {hung:.0f} s" if hung > self.hang_after_s else None
        hang.answered()
        if error is not None:
            log.error("probe inference%s failed: %s", which, error)
            return f"probe inference{which} failed: {error}"
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
    parser.add_argument("--no-graphs", dest="graphs", action="store_false",
                        help="check --model only, not the interaction graphs (<kind>-features) Triton serves beside it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check = ModelPathCheck(TritonAdmin(args.triton_http), args.model, every_s=args.every, probe_every_s=args.probe_every,
                           probe_timeout_s=args.probe_timeout, hang_after_s=args.hang_after, graphs=args.graphs)
    check.start()
    server = ThreadingHTTPServer((args.host, args.port), _handler(check))
    log.info("guarding %s model %r%s; liveness on http://%s:%d/v2/health/live", args.triton_http, args.model,
             " and its interaction graphs" if args.graphs else "", args.host, args.port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        check.stopping.set()
        server.server_close()
    return 0
