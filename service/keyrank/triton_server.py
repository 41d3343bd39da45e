"""The embedded Triton: the ``tritonserver`` binary shipped in the
``nvidia-pytriton`` wheel, run as a child process on the generated
``models/triton-embedded`` repository (Python backend running model.onnx with
ONNX Runtime).

It listens on loopback only and never outlives the gateway: it gets its own
process group (the Python backend stubs are its children, so one ``killpg``
reaches them all) and ``PR_SET_PDEATHSIG`` so the kernel kills it if we die.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from keyrank.config import Settings, get_settings
from keyrank.errors import KeyrankError, ModelAssetsMissing

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.1
_LOG_TAIL_BYTES = 256 * 1024
_LOG_ERROR_LINES = 10
_LOG_TAIL_LINES = 15


class EmbeddedTritonError(KeyrankError):
    """The embedded Triton cannot be found, started, or made ready."""


class _PytritonWheel:
    """Where the nvidia-pytriton wheel keeps the server and the Python backend."""

    def __init__(self) -> None:
        try:
            import pytriton
        except ImportError as exc:
            raise EmbeddedTritonError(
                "the embedded Triton needs the nvidia-pytriton wheel: pip install keyrank[embedded]"
            ) from exc
        root = Path(pytriton.__file__).parent / "tritonserver"
        major_minor = f"{sys.version_info.major}.{sys.version_info.minor}"
        self.binary: Path = root / "bin" / "tritonserver"
        """The tritonserver executable."""
        self.python_backend: Path = root / "backends" / "python"
        """libtriton_python.so and triton_python_backend_utils.py."""
        self.stub: Path = root / "python_backend_stubs" / major_minor / "triton_python_backend_stub"
        """The backend stub linked against this interpreter's libpython."""
        self.libs: Path = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
        """Shared libraries the binary was repaired against (auditwheel)."""
        for path in (self.binary, self.python_backend / "libtriton_python.so", self.stub):
            if not path.exists():
                raise EmbeddedTritonError(
                    f"nvidia-pytriton is installed but {path} is missing "
                    f"(no stub for Python {major_minor}?): pip install --force-reinstall keyrank[embedded]"
                )


def _free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports nobody listens on right now (the usual small race is accepted)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for sock in sockets:  # all held open together, so the kernel cannot hand out one twice
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# Resolved in the parent: between fork and exec the child may only make a plain call, since
# another thread (gRPC's, uvicorn's) may hold the loader's lock at the moment of the fork.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the spawning thread dies."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


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
    ) -> None:
        settings = settings or get_settings()
        self.settings: Settings = settings
        """Where the model name, ports and ready timeout come from."""
        self.repository: Path = Path(repository or settings.model_dir / "triton-embedded").resolve()
        """The Triton model repository served."""
        self.model: str = settings.triton_model
        """The model whose readiness ``wait_ready`` waits for."""
        # Ports are fixed once, so a restarted server is found at the same address by existing clients.
        wanted = [
            explicit if explicit is not None else configured
            for explicit, configured in (
                (http_port, settings.embedded_http_port),
                (grpc_port, settings.embedded_grpc_port),
                (metrics_port, settings.embedded_metrics_port),
            )
        ]
        free = iter(_free_ports(sum(1 for port in wanted if not port)))
        ports = [port or next(free) for port in wanted]
        self.http_port: int = ports[0]
        """Loopback HTTP port (health probes)."""
        self.grpc_port: int = ports[1]
        """Loopback gRPC port (inference)."""
        self.metrics_port: int = ports[2]
        """Loopback Prometheus port of Triton itself."""
        self._own_work_dir = work_dir is None
        self.work_dir: Path = Path(work_dir or tempfile.mkdtemp(prefix="keyrank-triton-"))
        """Private directory: backends/ and the log."""
        self.log_path: Path = self.work_dir / "tritonserver.log"
        """stdout + stderr of the server and of its Python backend stubs."""
        # The Python backend's shared-memory regions in /dev/shm carry this prefix, so the ones a
        # killed server leaves behind can be removed.
        self._shm_prefix = f"keyrank_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self._proc: subprocess.Popen | None = None
        self._reaper: threading.Thread | None = None
        # A gateway that exits without close() still stops its server and removes the private dir.
        atexit.register(self.close)

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
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def is_running(self) -> bool:
        return self.pid is not None

    # --- lifecycle -----------------------------------------------------------

    def _backend_dir(self, wheel: _PytritonWheel) -> Path:
        """backends/python/ with the backend library, its utils and the stub for this Python."""
        python_dir = self.work_dir / "backends" / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        sources = [
            wheel.python_backend / "libtriton_python.so",
            wheel.python_backend / "triton_python_backend_utils.py",
            wheel.stub,
        ]
        for src in sources:
            dst = python_dir / src.name
            if not dst.exists():
                dst.symlink_to(src)
        return python_dir.parent

    def _command(self, wheel: _PytritonWheel, backends: Path) -> list[str]:
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
            "--log-verbose=0",
            # A stop should not wait 30 s (the default) for in-flight requests of a dying gateway.
            "--exit-timeout-secs=5",
        ]

    def _environment(self, wheel: _PytritonWheel) -> dict[str, str]:
        env = dict(os.environ)
        # The stub embeds libpython of the running interpreter; the binary needs the wheel's libs.
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, str(wheel.libs), os.environ.get("LD_LIBRARY_PATH", "")) if p
        )
        # The stub finds its site-packages (onnxruntime, numpy) through the `python` on PATH.
        env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), os.environ.get("PATH", "")) if p)
        return env

    def start(self) -> EmbeddedTriton:
        """Spawn the server; returns at once (see ``wait_ready``)."""
        if self.is_running():
            return self
        if not (self.repository / self.model / "config.pbtxt").exists():
            raise ModelAssetsMissing(
                f"no Triton model {self.model!r} in {self.repository}: run `keyrank prepare` first"
            )
        wheel = _PytritonWheel()
        command = self._command(wheel, self._backend_dir(wheel))
        env = self._environment(wheel)
        spawned: list[subprocess.Popen | BaseException] = []
        done = threading.Event()

        # PR_SET_PDEATHSIG fires when the spawning *thread* exits, not the process; a dedicated
        # thread that spawns and then waits on the child lives exactly as long as the child (or
        # until this process dies, which is when the child must die).
        def spawn_and_reap() -> None:
            try:
                with open(self.log_path, "ab") as log:
                    proc = subprocess.Popen(
                        command,
                        env=env,
                        cwd=self.work_dir,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=_die_with_parent if _prctl is not None else None,
                    )
            except BaseException as exc:  # handed to start()
                spawned.append(exc)
                done.set()
                return
            spawned.append(proc)
            done.set()
            proc.wait()

        self._reaper = threading.Thread(target=spawn_and_reap, name="keyrank-triton-reaper", daemon=True)
        self._reaper.start()
        done.wait()
        if isinstance(spawned[0], BaseException):
            raise EmbeddedTritonError(f"cannot start {wheel.binary}: {spawned[0]}") from spawned[0]
        self._proc = spawned[0]
        return self

    def _probe(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.http_url + path, timeout=1.0) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float | None = None) -> float:
        """Block until the server and the model are ready; returns the seconds waited."""
        timeout = self.settings.embedded_ready_timeout_s if timeout is None else timeout
        t0 = time.monotonic()
        while True:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise EmbeddedTritonError(f"tritonserver exited (code {code}) before ready:\n{self.log_tail()}")
            if self._probe("/v2/health/ready") and self._probe(f"/v2/models/{self.model}/ready"):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise EmbeddedTritonError(f"tritonserver not ready after {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(_POLL_S)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``timeout``; no orphans."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # Stubs may outlive a server that exited on its own; the group still names them.
        self._signal_group(proc.pid, signal.SIGKILL)
        self._finish(proc)

    def kill(self) -> None:
        """SIGKILL the whole group at once: a crash, for failure tests."""
        proc = self._proc
        if proc is None:
            return
        self._signal_group(proc.pid, signal.SIGKILL)
        self._finish(proc)

    def restart(self, timeout: float | None = None) -> float:
        """Stop, start on the same ports, wait until ready; returns the seconds to ready."""
        self.stop()
        return self.start().wait_ready(timeout)

    def close(self) -> None:
        """Stop and remove the private work dir (if we made it); idempotent."""
        atexit.unregister(self.close)
        self.stop()
        if self._own_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass

    def _finish(self, proc: subprocess.Popen) -> None:
        proc.wait()
        if self._reaper is not None:
            self._reaper.join()
        self._proc = None
        self._reaper = None
        for leftover in Path("/dev/shm").glob(self._shm_prefix + "*"):
            leftover.unlink(missing_ok=True)

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
