"""Supervision of the embedded model path: tritonserver, its Python backend stubs, the model.

Triton keeps reporting the model ready after its Python backend stub (the
process that runs ONNX Runtime, the largest, the one an OOM kill picks) died:
every inference then fails with "Stub process ... is not healthy" and nothing
restarts it. So the supervisor watches, every ``tick``:

- the tritonserver process (exited -> restart it);
- the stubs, as children of tritonserver (one died or is a zombie -> unload the
  models at once, which turns Triton's model readiness and so the gateway's
  ``/readyz`` to 503, then load them again through the repository API);
- Triton's own view (server id is ours, models ready) and, on a thread of its
  own, a tiny real inference (an error, or a hang: probes timing out for
  ``hang_after_s`` while Triton's statistics show no execution finishing; a
  model that is only busy, its probes queued behind big batches, still
  finishes executions and is left alone).

"The model" is each model loaded: every cross-encoder and every interaction
graph installed beside one (``<kind>-features``, CEDR and Model 1), watched
and repaired alike, since a strategy is served only while its graph is.

Repairs are bounded: failed ones back off, and after ``max_repairs`` of them in
a row (a repair whose fault is back within ``stable_after_s`` counts as failed)
the supervisor gives up and says why (``keyrank serve`` then exits non-zero).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Protocol

from keyrank.modelserver.admin import TritonAdmin
from keyrank.modelserver.stubs import Stub, model_stubs

log = logging.getLogger("keyrank.modelserver.supervision")

class SupervisedServer(Protocol):
    """What supervision needs of a Triton it watches (``embedded.EmbeddedTriton`` is one): named here so
    this module does not import the one that imports it."""

    model: str
    """The default model."""
    models: tuple[str, ...]
    """Every cross-encoder served, loaded, watched and repaired (``keyrank serve --models`` loads several)."""
    graphs: tuple[str, ...]
    """The interaction graphs loaded beside them (four inputs: their probe sends token roles), watched and repaired alike."""
    watched: tuple[str, ...]
    """``models`` then ``graphs``."""
    server_id: str
    lifecycle: Any
    """Lock held while the process is (re)started or stopped."""

    @property
    def wanted(self) -> bool: ...
    @property
    def serving(self) -> bool: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def admin(self) -> TritonAdmin: ...
    def reload_model(self, models: Sequence[str] | None = None) -> None: ...
    def restart_locked(self) -> None: ...
    def log_tail(self) -> str: ...


# --- faults -------------------------------------------------------------------------------


class Repair(Enum):
    """What brings the model path back: decided by the check that finds the fault, not by its wording."""

    RELOAD = "model reload"
    """Unload and load the faulty models: replaces dead or wedged stubs behind a server that is still ours."""
    RESTART = "Triton restart"
    """A new tritonserver on the same ports: the server exited, or what answers on its port is not it."""


@dataclass(frozen=True)
class Fault:
    """What is wrong with the model path right now, and how it is repaired."""

    repair: Repair
    """The repair tried first (a reload that fails is followed by restarts)."""
    reason: str
    """What was seen, for the log and for the message when supervision gives up."""
    models: tuple[str, ...] = ()
    """The models a reload replaces: those found faulty; empty, every model (a restart always restarts them all)."""
    server_pid: int | None = None
    """The tritonserver the fault was seen on (None: not known, or none was running)."""

    def __str__(self) -> str:
        return self.reason


def _models_of(stubs: dict[int, Stub], pids: Sequence[int]) -> tuple[str, ...]:
    """The models these stubs ran, each once (empty if one is unknown: then every model is reloaded)."""
    models = tuple(dict.fromkeys(stubs[p].model if p in stubs else "" for p in pids))
    return () if "" in models else models


# --- the supervisor -------------------------------------------------------------------------


class HangClock:
    """Since when the model has been hung: probes time out AND no execution finishes.

    Under heavy load a probe queues behind big batches and times out although the model
    works; restarting it then would only throw the queue away. Triton's execution count
    tells the two apart: while it rises, the model is busy, not hung. Where it cannot be
    read (statistics API closed), only the length of the run of timed-out probes counts.
    """

    def __init__(self) -> None:
        self.since: float | None = None
        self.timeouts = 0
        """Timed-out probes so far, and those forgiven because executions still finished (for tests and logs)."""
        self.busy_timeouts = 0
        self._executions: int | None = None

    def answered(self) -> None:
        self.since, self._executions = None, None

    def timed_out(self, sent_at: float, executions: int | None) -> None:
        progressed = executions is not None and self._executions is not None and executions > self._executions
        self.timeouts += 1
        if progressed:
            self.busy_timeouts += 1
        if self.since is None or progressed:
            self.since = sent_at
        self._executions = executions


class _InferenceProber(threading.Thread):
    """Runs the probe inference every ``every_s`` on its own thread (a queued probe must not delay the tick)."""

    def __init__(self, triton: SupervisedServer, every_s: float, timeout_s: float, stopping: threading.Event):
        super().__init__(name="keyrank-triton-prober", daemon=True)
        self.triton = triton
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.stopping = stopping
        self.last_error: tuple[float, str, tuple[str, ...], int | None] | None = None
        """(monotonic time it was sent, error, the models that failed it, the server process it was sent to) of the
        latest failed probe; None after a success."""
        self.hung_models: tuple[str, ...] = ()
        """The models whose probe timed out last (what the hang clock blames)."""
        self.hang = HangClock()

    @property
    def hung_since(self) -> float | None:
        """When the model stopped finishing executions while probes time out; None if it is not hung."""
        return self.hang.since

    def run(self) -> None:
        while not self.stopping.wait(self.every_s):
            if not self.triton.serving:
                self.last_error = None
                self.hang.answered()
                continue
            started = time.monotonic()  # a probe sent before a repair must not blame the repaired model
            pid = self.triton.pid  # nor one sent to a server that a restart has replaced since
            admin, graphs = self.triton.admin, self.triton.graphs
            errors = {model: admin.probe_inference(model, self.timeout_s, graph=model in graphs)
                      for model in self.triton.watched}
            timed_out = [model for model, error in errors.items() if error == "timeout"]
            if timed_out:
                counts = [admin.execution_count(model) for model in timed_out]
                self.hang.timed_out(started, None if None in counts else sum(counts))
                self.hung_models = tuple(timed_out)
                continue
            self.hang.answered()
            failed = {model: error for model, error in errors.items() if error is not None}
            message = "; ".join(f"{m}: {e}" if len(errors) > 1 else e for m, e in failed.items())
            self.last_error = (started, message, tuple(failed), pid) if failed else None


class Supervisor(threading.Thread):
    """Keeps one ``EmbeddedTriton`` serving: detects a dead model path within ``tick_s`` and repairs it."""

    def __init__(
        self,
        triton: SupervisedServer,
        *,
        max_repairs: int = 5,
        backoff_s: float = 1.0,
        tick_s: float = 0.1,
        http_every_s: float = 0.5,
        probe_every_s: float = 2.0,
        probe_timeout_s: float = 10.0,
        hang_after_s: float = 30.0,
        stable_after_s: float = 10.0,
        stopped_after_s: float | None = 0.3,
        on_give_up: Callable[[str], None] | None = None,
    ):
        super().__init__(name="keyrank-triton-supervisor", daemon=True)
        self.triton = triton
        self.max_repairs = max_repairs
        self.backoff_s = backoff_s
        self.tick_s = tick_s
        self.http_every_s = http_every_s
        self.hang_after_s = hang_after_s
        self.stable_after_s = stable_after_s
        self.stopped_after_s = stopped_after_s
        """A stub stopped (SIGSTOP, a debugger) this long is killed and repaired; None = leave it to the hang clock."""
        self.on_give_up = on_give_up
        self.stopping = threading.Event()
        self.failure: str | None = None
        """Why the supervisor gave up; None while it keeps the server serving."""
        self.repairs: list[tuple[str, float]] = []
        """(what was done, seconds from detection to serving again) of each successful repair."""
        self._prober = _InferenceProber(triton, probe_every_s, probe_timeout_s, self.stopping)
        self._stubs: dict[int, Stub] = {}  # the live stubs of our model at the last tick
        self._stubs_of: int | None = None
        self._stopped_since: dict[int, float] = {}
        self._next_http = 0.0
        self._failures = 0  # failed repairs in a row (a repair that did not hold for stable_after_s counts)
        self._repaired_at = 0.0

    def start(self) -> None:
        super().start()
        self._prober.start()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        while not self.stopping.wait(self.tick_s):
            try:
                fault = self.diagnose()
                if fault is None:
                    continue
                self.repair(fault)
            except Exception:  # a supervisor bug must not end supervision
                log.exception("supervision tick failed")
            if self.failure is not None:
                return

    # --- detection ----------------------------------------------------------------------

    def diagnose(self) -> Fault | None:
        """What is wrong with the model path right now, or None; the fault names the server it was seen on."""
        pid = self.triton.pid
        fault = self._diagnose(pid)
        return None if fault is None else replace(fault, server_pid=pid)

    def _diagnose(self, pid: int | None) -> Fault | None:
        triton = self.triton
        if not triton.wanted or not triton.serving:
            return None  # stopped on purpose, or (re)starting: whoever starts it waits for ready
        if pid is None:
            return Fault(Repair.RESTART, f"tritonserver exited (code {triton.returncode})")
        fault = self._check_stubs(pid)
        if fault is not None:
            return fault
        now = time.monotonic()
        if now >= self._next_http:
            self._next_http = now + self.http_every_s
            if triton.admin.server_id() not in (triton.server_id, None):
                return Fault(Repair.RESTART, "Triton's port answers with another server's id")
            for model in triton.watched:
                if not triton.admin.model_ready(model):
                    return Fault(Repair.RELOAD, f"model {model!r} is not ready", (model,))
        error = self._prober.last_error
        if error is not None and error[0] > self._repaired_at and error[3] == pid:
            return Fault(Repair.RELOAD, f"probe inference failed: {error[1]}", error[2])
        hung = self._prober.hung_since
        if hung is not None and hung > self._repaired_at and now - hung > self.hang_after_s:
            return Fault(Repair.RELOAD, f"probe inference hung for {now - hung:.0f} s", self._prober.hung_models)
        return None

    def _check_stubs(self, server_pid: int) -> Fault | None:
        """A stub of our models (and graphs) that died (and was not replaced) or stays stopped; None if all is well.

        A stub that exits after a newer one started for the same instance was replaced, not
        killed: Triton unloads in the background, so the stub of an unloaded (or reloaded) model
        exits seconds after its successor serves. Taking that exit for a crash made each repair
        cause the next one.
        """
        if self._stubs_of != server_pid:
            self._stubs, self._stubs_of, self._stopped_since = {}, server_pid, {}
        stubs = {pid: stub for model in self.triton.watched for pid, stub in model_stubs(server_pid, model).items()}
        live = {pid: stub for pid, stub in stubs.items() if stub.state not in ("Z", "X")}
        died = sorted(
            pid for pid, stub in self._stubs.items()
            if pid not in live and not any(s.instance == stub.instance and s.started > stub.started for s in live.values())
        )
        models = _models_of(self._stubs, died)
        self._stubs = live
        if died:
            return Fault(Repair.RELOAD, f"model process died (Python backend stub pid {', '.join(map(str, died))})", models)
        now = time.monotonic()
        stopped = {pid: self._stopped_since.get(pid, now) for pid, stub in live.items() if stub.state in ("T", "t")}
        self._stopped_since = stopped
        if self.stopped_after_s is None:
            return None
        stuck = sorted(pid for pid, since in stopped.items() if now - since >= self.stopped_after_s)
        if not stuck:
            return None
        models = _models_of(self._stubs, stuck)
        # A stopped stub answers nothing ("Stub process ... is not healthy") while Triton still says
        # ready; killing it turns it into the dead stub the repair below replaces, and it cannot
        # wake up later (SIGCONT) to talk to a server that has moved on.
        for pid in stuck:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._stubs.pop(pid, None)
        return Fault(Repair.RELOAD, f"model process stopped for {now - min(stopped[p] for p in stuck):.1f} s "
                                    f"(Python backend stub pid {', '.join(map(str, stuck))}); killed it", models)

    # --- repair -------------------------------------------------------------------------------

    def repair(self, fault: Fault) -> None:
        """The fault's repair: a reload if the server still lives, else (or if that fails) a restart.

        Readiness turns false at once (a model-level fault unloads the model before anything
        else); only failed repairs back off (1 s, 2 s, 4 s, ... capped at 30 s), and
        ``max_repairs`` of them in a row end supervision. A repair whose fault comes back within
        ``stable_after_s`` counts as failed: a crash loop is bounded too.
        """
        detected = time.monotonic()
        triton = self.triton
        seen_pid = triton.pid
        # Restarted (by a test, an operator) between the check that saw the fault and now: the model to unload
        # belonged to the server that is gone, and the loop below only confirms the new one serves.
        replaced = fault.server_pid is not None and seen_pid != fault.server_pid
        if self._repaired_at and detected - self._repaired_at < self.stable_after_s:
            self._failures += 1
        elif self._failures and detected - self._repaired_at >= self.stable_after_s:
            self._failures = 0
        log.error("embedded Triton: %s; repairing", fault)
        # The server may have exited since the fault was seen: then only a restart helps.
        how = fault.repair if seen_pid is not None else Repair.RESTART
        # Only the faulty models are reloaded: a graph's fault leaves the cross-encoder's stubs (and its
        # strategies) serving.
        scope = tuple(m for m in triton.watched if m in fault.models) or tuple(triton.watched)
        if how is Repair.RELOAD and not replaced:
            # Under the lock and only on the server that faulted: a restart (a test, an operator) between the
            # check above and this unload would otherwise have it unload the model its successor just loaded.
            with triton.lifecycle:
                if triton.pid == seen_pid:
                    for model in scope:
                        triton.admin.unload(model)  # /readyz 503 now, whatever the backoff below
        while not self.stopping.is_set() and triton.wanted:
            if self._failures >= self.max_repairs:
                self._give_up(fault)
                return
            if self._failures and self.stopping.wait(min(30.0, self.backoff_s * 2 ** (self._failures - 1))):
                return
            try:
                with triton.lifecycle:
                    if not triton.wanted:
                        return
                    if (replaced or triton.pid not in (seen_pid, None)) and triton.serving and all(
                        triton.admin.model_ready(model) for model in triton.watched
                    ):
                        return  # someone (a test, an operator) restarted it meanwhile
                    if how is Repair.RELOAD:
                        triton.reload_model(scope)
                    else:
                        triton.restart_locked()
            except Exception as exc:  # noqa: BLE001 -- counted; the next attempt restarts the whole server
                if not triton.wanted:
                    return  # stopped on purpose while we repaired
                log.error("embedded Triton: %s failed: %s", how.value, exc)
                self._failures += 1
                how, seen_pid = Repair.RESTART, triton.pid
                continue
            took = time.monotonic() - detected
            self.repairs.append((how.value, took))
            self._repaired_at = time.monotonic()
            log.warning("embedded Triton serving again after %s (%.1f s after detection)", how.value, took)
            return

    def _give_up(self, fault: Fault) -> None:
        self.failure = (
            f"embedded Triton could not be kept serving: {fault}; gave up after {self.max_repairs} failed repairs "
            f"in a row (set KEYRANK_EMBEDDED_MAX_REPAIRS to allow more)\n{self.triton.log_tail()}"
        )
        log.critical("%s", self.failure)
        if self.on_give_up is not None:
            self.on_give_up(self.failure)
