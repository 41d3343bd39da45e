"""The embedded Triton: the ``tritonserver`` binary shipped in the
``nvidia-pytriton`` wheel, run as a child process on the generated
``models/triton-embedded`` repository (Python backend running model.onnx with
ONNX Runtime), staged at each start in its work dir (``repository``).

It listens on loopback only, on free ports unless told otherwise, never outlives
the gateway (``process``), and writes only into a private work dir (``workdir``).
Each server gets a random ``--id`` that the ready probe checks, so another
process on the same port is never mistaken for ours, and a random admin key:
without it only health, metadata and inference answer (Triton's restricted-API
options). Models are loaded explicitly, so the
supervisor (supervision.py, on by default) can unload and reload a model whose
stub died.
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from keyrank.config import Settings, get_settings
from keyrank.errors import ModelAssetsMissing
from keyrank.modelserver.admin import TritonAdmin
from keyrank.modelserver.arguments import (
    GRPC_PING_POLICY,
    PORT_SETTINGS,
    EmbeddedTritonError,
    PytritonWheel,
    check_port_free,
    free_ports,
    missing_model_message,
)
from keyrank.modelserver.process import ServerProcess
from keyrank.modelserver.repository import GRAPH_SUFFIX, repository_models, served_models, stage
from keyrank.modelserver.supervision import Supervisor
from keyrank.modelserver.workdir import WorkDir

__all__ = ["ADMIN_HEADER", "GRPC_ADMIN_HEADER", "EmbeddedTriton", "EmbeddedTritonError"]

_POLL_S = 0.1
_LOG_TAIL_BYTES = 256 * 1024
_LOG_ERROR_LINES = 10
_LOG_TAIL_LINES = 15
ADMIN_HEADER = "keyrank-admin"
"""HTTP header carrying the embedded server's admin key."""
GRPC_ADMIN_HEADER = "triton-grpc-protocol-" + ADMIN_HEADER
"""The same key as gRPC metadata (Triton prefixes the restricted-protocol key)."""
# Everything but health, metadata and inference needs the admin key.
RESTRICTED_APIS = "shared-memory,model-config,model-repository,statistics,trace,logging"


class EmbeddedTriton:
    """A tritonserver child process on loopback ports; ``with`` starts it and waits until ready."""

    def __init__(
        self,
        repository: Path | None = None,
        *,
        settings: Settings | None = None,
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        work_dir: Path | None = None,
        supervise: bool = True,
        on_give_up: Callable[[str], None] | None = None,
    ) -> None:
        settings = settings or get_settings()
        self.settings: Settings = settings
        """Where the model name, ports and ready timeout come from."""
        served = {} if repository is not None else settings.served_models()
        self.models: tuple[str, ...] = tuple(served) or (settings.triton_model,)
        """The models loaded, watched and repaired: KEYRANK_MODELS' names (each its own Triton model), else one."""
        self.model: str = self.models[0]
        """The default model (the only one unless KEYRANK_MODELS names several)."""
        variant = settings.embedded_repository()
        self.prepared: dict[str, Path] = (served_models(served, variant.name) if served
                                          else repository_models(Path(repository or variant).resolve(), self.model))
        """Each model's folder as `keyrank prepare` (or `keyrank finetune --install-into`) wrote it (config.pbtxt,
        version folders), by the name it is served as."""
        self._served = served
        self.graphs: tuple[str, ...] = tuple(
            n for n, folder in self.prepared.items() if folder.name.endswith(GRAPH_SUFFIX) and n not in self.models)
        """Interaction graphs installed beside the models (``keyrank finetune --install-into``): loaded with them,
        watched and repaired like them; with several models, each named for its model (``Settings.graph_model``)."""

        # Ports are fixed once, so a restarted server is found at the same address by existing clients.
        ports = _loopback_ports(settings, http_port, grpc_port, metrics_port)
        self._port_settings = dict(zip(ports, PORT_SETTINGS))
        self.http_port: int = ports[0]
        """Loopback HTTP port (health probes)."""
        self.grpc_port: int = ports[1]
        """Loopback gRPC port (inference)."""
        self.metrics_port: int = ports[2]
        """Loopback Prometheus port of Triton itself."""

        self._work = WorkDir(work_dir)  # sweeps what killed servers left, then holds its own lock
        self.work_dir: Path = self._work.path
        """Private directory: backends/, the log, the served repository."""
        self._shm_prefix = self._work.shm_prefix
        self.repository: Path = self.work_dir / "repository"
        """The repository Triton serves: staged from ``prepared`` at each start."""
        if served:  # a folder that was not prepared is named before anything starts
            try:
                self._stage()
            except ModelAssetsMissing:
                self._work.remove()
                raise
        self.log_path: Path = self.work_dir / "tritonserver.log"
        """stdout + stderr of the server and of its Python backend stubs."""

        self.server_id: str = f"keyrank-{os.getpid()}-{secrets.token_hex(6)}"
        """``--id`` of the server, reported by GET /v2: the ready probe checks it is ours."""
        self.admin_key: str = secrets.token_urlsafe(24)
        """Unlocks the restricted APIs (header ``keyrank-admin``). Triton takes it only on its command
        line, so a local user who reads /proc/<pid>/cmdline can see it: it shuts out clients that
        merely reach the port, not a local shell (mount /proc with hidepid for that)."""
        self.admin: TritonAdmin = TritonAdmin(self.http_url, (ADMIN_HEADER, self.admin_key))
        """HTTP health, identity, repository control and probe inference."""

        self.lifecycle: threading.RLock = threading.RLock()
        """Held while the server is started, stopped or repaired (by a caller or the supervisor)."""
        self.wanted: bool = False
        """Started and not stopped on purpose: the supervisor repairs only what is wanted."""
        self.serving: bool = False
        """Became ready since its last (re)start; a crash does not clear it, a stop does."""
        self._proc: ServerProcess | None = None
        self._reload_config: dict[str, dict | None] = {}
        self._supervise = supervise
        self._on_give_up = on_give_up
        self.supervisor: Supervisor | None = None
        """The thread that keeps the model path serving (None when not supervised)."""
        # A gateway that exits without close() still stops its server and removes the private dir.
        atexit.register(self.close)

    def _stage(self) -> None:
        """``repository`` from the prepared folders; raises ModelAssetsMissing naming one not prepared."""
        for name, folder in self.prepared.items():
            config = folder / "config.pbtxt"
            if not config.is_file():
                if name in self._served:
                    raise ModelAssetsMissing(f"model {name!r}: {config} not found (run `keyrank prepare --out {self._served[name]}`)")
                raise ModelAssetsMissing(missing_model_message(folder.parent, name))
        stage(self.repository, self.prepared)

    @property
    def watched(self) -> tuple[str, ...]:
        """Every model loaded at start, then watched and repaired: the cross-encoders, then the graphs."""
        return self.models + self.graphs

    # --- addresses ---------------------------------------------------------

    @property
    def grpc_url(self) -> str:
        """host:port for ``tritonclient.grpc`` (and ``KEYRANK_TRITON_URL``)."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP endpoint."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def pid(self) -> int | None:
        """The tritonserver process id while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.running() else None

    @property
    def returncode(self) -> int | None:
        """Exit code of the last server process, once it has exited."""
        return None if self._proc is None else self._proc.returncode

    def is_running(self) -> bool:
        return self.pid is not None

    @property
    def failure(self) -> str | None:
        """Why supervision gave up, if it did."""
        return None if self.supervisor is None else self.supervisor.failure

    # --- lifecycle -----------------------------------------------------------

    def _command(self, wheel: PytritonWheel, backends: Path) -> list[str]:
        return [
            str(wheel.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={backends}",
            f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}",
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.grpc_port}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",
            "--exit-on-error=true",
            "--strict-readiness=true",
            # config.pbtxt is complete; auto-completion spawns a throwaway stub, seconds per (re)load.
            "--disable-auto-complete-config",
            f"--id={self.server_id}",
            # Explicit control: the supervisor can unload a model whose stub died (readiness 503 at
            # once) and load it again; only our model is loaded, and only with the admin key.
            "--model-control-mode=explicit",
            *(f"--load-model={model}" for model in self.watched),
            f"--http-restricted-api={RESTRICTED_APIS}:{ADMIN_HEADER}={self.admin_key}",
            f"--grpc-restricted-protocol={RESTRICTED_APIS}:{ADMIN_HEADER}={self.admin_key}",
            "--log-verbose=0",
            # The gateway pings every few seconds (KEYRANK_TRITON_KEEPALIVE_S), calls or none: Triton's default policy
            # (a ping per 5 min without data, 2 strikes) would answer that with GOAWAY.
            *GRPC_PING_POLICY,
            # A stop should not wait 30 s (the default) for in-flight requests of a dying gateway.
            "--exit-timeout-secs=5",
        ]

    def start(self) -> EmbeddedTriton:
        """Spawn the server (and its supervisor); returns at once (see ``wait_ready``)."""
        with self.lifecycle:
            self.wanted = True
            self._start_locked()
            self._supervised()
        return self

    def _supervised(self) -> None:
        if self._supervise and self.supervisor is None:
            self.supervisor = Supervisor(
                self, max_repairs=self.settings.embedded_max_repairs, backoff_s=self.settings.embedded_repair_backoff_s,
                on_give_up=self._on_give_up,
            )
            self.supervisor.start()

    def _start_locked(self) -> None:
        if self.is_running():
            return
        self._stage()
        wheel = PytritonWheel()
        command = self._command(wheel, wheel.backend_dir(self.work_dir))
        for port, setting in self._port_settings.items():  # a restart finds a port taken meanwhile at once
            check_port_free(port, setting)
        self.serving = False
        try:
            nice = self.settings.embedded_nice if self.settings.embedded_device == "cpu" else 0
            self._proc = ServerProcess(command, wheel.environment(), self.work_dir, self.log_path, nice)
        except Exception as exc:
            raise EmbeddedTritonError(f"cannot start {wheel.binary}: {exc}") from exc

    def _exited_message(self, code: int | None) -> str:
        tail = self.log_tail()
        taken = re.search(r"(\d+\.\d+\.\d+\.\d+):(\d+)'? already in use", tail) or re.search(r":(\d+)\D{0,40}already in use", tail)
        if taken:
            port = int(taken.group(taken.lastindex))
            setting = self._port_settings.get(port, "its port setting")
            return (
                f"tritonserver exited (code {code}): port {port} ({setting}) is already in use by another process; "
                f"unset {setting} (or set it to 0) to use a free port\n{tail}"
            )
        return f"tritonserver exited (code {code}) before ready:\n{tail}"

    def wait_ready(self, timeout: float | None = None) -> float:
        """Block until the server is ours (its id), ready, and every model ready; returns the seconds waited."""
        timeout = self.settings.embedded_ready_timeout_s if timeout is None else timeout
        t0 = time.monotonic()
        while True:
            proc = self._proc
            if proc is None or not proc.running():
                raise EmbeddedTritonError(self._exited_message(None if proc is None else proc.returncode))
            if not self.wanted:
                raise EmbeddedTritonError("embedded Triton stopped while waiting for it to be ready")
            # Another process on our port would answer the health probes: only our own id counts.
            if (
                self.admin.server_id() == self.server_id
                and self.admin.server_ready()
                and all(self.admin.model_ready(model) for model in self.watched)
            ):
                # On CPU a warm-up buys nothing (first runs cost what later ones do) and it delays a
                # repair by seconds: a reload uses this config without it.
                for model in self.watched:
                    config = self.admin.config(model) or {}
                    config.pop("model_warmup", None)
                    self._reload_config[model] = config or None
                self.serving = True
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise EmbeddedTritonError(f"tritonserver not ready after {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(_POLL_S)

    def reload_model(self, models: Sequence[str] | None = None, timeout: float | None = None) -> float:
        """Unload ``models`` (default: every model and graph; readiness turns false at once), load them again;
        returns the seconds taken. The others keep their model processes and serve throughout.

        Triton ignores a load of an unchanged, loaded model, so the unload is what replaces dead stubs.
        """
        timeout = self.settings.embedded_ready_timeout_s if timeout is None else timeout
        t0 = time.monotonic()
        with self.lifecycle:
            for model in self.watched if models is None else models:
                if not self.admin.unload(model):
                    raise EmbeddedTritonError(f"Triton refused to unload {model!r}")
                error = self.admin.load(model, timeout, self._reload_config.get(model))
                if error is not None:
                    raise EmbeddedTritonError(f"Triton could not load {model!r} again: {error}")
                if not self.admin.model_ready(model):
                    raise EmbeddedTritonError(f"{model!r} not ready after its reload")
        return time.monotonic() - t0

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``timeout``; no orphans; no repair."""
        self.wanted = False  # before the lock: a supervisor's wait_ready gives up instead of holding it
        supervisor, self.supervisor = self.supervisor, None
        if supervisor is not None:
            supervisor.stop()
        with self.lifecycle:
            self._stop_locked(timeout)

    def _stop_locked(self, timeout: float = 10.0) -> None:
        self.serving = False
        if self._proc is not None:
            self._proc.stop(timeout)
            self._work.remove_shared_memory()

    def kill(self) -> None:
        """SIGKILL the whole group at once: a crash, for failure tests (the supervisor repairs it)."""
        with self.lifecycle:
            if self._proc is not None:
                self._proc.kill()
                self._work.remove_shared_memory()

    def restart(self, timeout: float | None = None) -> float:
        """Stop, start on the same ports, wait until ready; returns the seconds to ready."""
        with self.lifecycle:
            self.wanted = True
            waited = self.restart_locked(timeout)
            self._supervised()
            return waited

    def restart_locked(self, timeout: float | None = None) -> float:
        """``restart`` for a caller that holds ``lifecycle`` (the supervisor)."""
        self._stop_locked()
        self._start_locked()
        return self.wait_ready(timeout)

    def close(self) -> None:
        """Stop the supervisor and the server, remove the private work dir (if we made it); idempotent."""
        atexit.unregister(self.close)
        self.stop()
        self._work.remove()

    def log_tail(self, n_bytes: int = _LOG_TAIL_BYTES) -> str:
        """What went wrong, from the end of the server log: its error lines, then its last lines.

        Triton prints wide tables on startup; they are dropped so the model's own traceback
        (an ``E`` line) is not pushed out of the message.
        """
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - n_bytes))
                lines = log.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return "(no log)"
        lines = [line for line in lines if line.strip() and not line.startswith(("|", "+"))]
        # No CUDA on a CPU host is expected; it is not the error anyone is looking for.
        errors = [line for line in lines if re.match(r"E\d{4} ", line) and "Cuda" not in line]
        report = errors[-_LOG_ERROR_LINES:] + ["--- last lines of " + str(self.log_path)] + lines[-_LOG_TAIL_LINES:]
        return "\n".join(report)

    def __enter__(self) -> EmbeddedTriton:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _loopback_ports(settings: Settings, *explicit: int | None) -> list[int]:
    """(http, grpc, metrics): an explicit port, else the setting's; one given must be free now, and
    0 / unset gets a free one."""
    configured = (settings.embedded_http_port, settings.embedded_grpc_port, settings.embedded_metrics_port)
    wanted = [port if port is not None else setting for port, setting in zip(explicit, configured)]
    for port, setting in zip(wanted, PORT_SETTINGS):
        if port:
            check_port_free(port, setting)
    free = iter(free_ports(sum(1 for port in wanted if not port)))
    return [port or next(free) for port in wanted]
