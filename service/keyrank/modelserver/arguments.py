"""What the embedded Triton needs before it starts: the nvidia-pytriton wheel's
server and Python backend, free loopback ports, and the model in the repository.
"""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
from pathlib import Path

from keyrank.cores import CORES_ENV, thread_count
from keyrank.errors import KeyrankError

PORT_SETTINGS = ("KEYRANK_EMBEDDED_HTTP_PORT", "KEYRANK_EMBEDDED_GRPC_PORT", "KEYRANK_EMBEDDED_METRICS_PORT")
"""The variables that fix the embedded ports, in (http, grpc, metrics) order."""
GRPC_PING_POLICY = (
    "--grpc-keepalive-time=10000",
    "--grpc-keepalive-timeout=5000",
    "--grpc-keepalive-permit-without-calls=1",
    "--grpc-http2-max-pings-without-data=0",
    "--grpc-http2-min-recv-ping-interval-without-data=1000",
    "--grpc-http2-max-ping-strikes=0",
)
"""Triton's side of the keepalive: it pings idle clients every 10 s, and takes the gateway's pings (every
KEYRANK_TRITON_KEEPALIVE_S, calls or none) without counting them as abuse. The chart and compose pass the same."""


# tritonserver starts each stub as `bash -c "exec <backend dir>/python/triton_python_backend_stub ..."`
# (argv[5] is the server's pid). This stands in for the stub: it forks a watcher, then becomes the
# real stub. The watcher waits on the server (pidfd) and SIGKILLs the stub when the server dies;
# it dies with the stub (parent-death signal). Without it a SIGKILLed server left its stubs running
# (PPID 1, ~200 MB each). The stub itself cannot take the parent-death signal: tritonserver forks
# it from a thread that ends once the model is loaded, and the signal follows that thread.
_STUB_WRAPPER = """#!{python} -SE
import os, select, signal, sys
server = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5].isdigit() else os.getppid()
if os.getppid() != server:
    sys.exit("triton_python_backend_stub: tritonserver died before its stub started")
stub = os.getpid()
if os.fork() == 0:
    import ctypes
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG: gone with the stub
    os.closerange(3, 65536)  # hold none of the server's sockets or shared memory
    if os.getppid() == stub:
        try:
            select.select([os.pidfd_open(server)], [], [])  # readable once the server has exited
        except OSError:
            pass
        os.kill(stub, signal.SIGKILL)
    os._exit(0)
os.execv({stub!r}, sys.argv)
"""


class EmbeddedTritonError(KeyrankError):
    """The embedded Triton cannot be found, started, or made ready."""


class PytritonWheel:
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

    def backend_dir(self, work_dir: Path) -> Path:
        """``work_dir/backends`` holding python/ with the backend library, its utils and our stub wrapper."""
        python_dir = work_dir / "backends" / "python"
        python_dir.mkdir(parents=True, exist_ok=True)
        for src in (self.python_backend / "libtriton_python.so", self.python_backend / "triton_python_backend_utils.py"):
            dst = python_dir / src.name
            if not dst.exists():
                dst.symlink_to(src)
        stub = python_dir / self.stub.name
        if not stub.exists():
            stub.write_text(_STUB_WRAPPER.format(python=sys.executable, stub=str(self.stub)))
            stub.chmod(0o755)
        return python_dir.parent

    def environment(self) -> dict[str, str]:
        """The server's environment: the wheel's libraries and this interpreter's libpython and site-packages."""
        env = dict(os.environ)
        # The stub embeds libpython of the running interpreter; the binary needs the wheel's libs.
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, str(self.libs), os.environ.get("LD_LIBRARY_PATH", "")) if p
        )
        # The stub finds its site-packages (onnxruntime, numpy) through the `python` on PATH.
        env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), os.environ.get("PATH", "")) if p)
        # The Python model imports nothing from keyrank: it sizes its threads from the count keyrank makes here
        # (a container's CPU limit counted), unless the user set one.
        env.setdefault(CORES_ENV, str(thread_count()))
        return env


# --- ports -----------------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports nobody listens on right now (the usual small race is accepted)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for sock in sockets:  # all held open together, so the kernel cannot hand out one twice
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def check_port_free(port: int, setting: str) -> None:
    """Fail clearly now rather than through a server that dies on "already in use" later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as tritonserver binds
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise EmbeddedTritonError(
                f"port {port} ({setting}) is taken by another process ({exc.strerror}): "
                f"unset {setting} (or set it to 0) to use a free port"
            ) from exc


# --- the model -------------------------------------------------------------------------------


def missing_model_message(repository: Path, model: str) -> str:
    """Where we looked for the model and, if prepared models exist elsewhere, where they are."""
    model_dir = repository.parent
    message = f"no Triton model {model!r} at {repository.resolve() / model / 'config.pbtxt'}"
    if not model_dir.is_absolute():
        message += f" (model dir {str(model_dir)!r} is relative to the current folder {Path.cwd()})"
    checkout = Path(__file__).resolve().parents[3]  # the source tree of an editable install (service/keyrank/modelserver/)
    candidates = [Path.cwd() / "models", checkout / "models", Path.cwd().parent / "models"]
    found = [c.resolve() for c in candidates if (c / repository.name / model / "config.pbtxt").exists()]
    found = [c for c in dict.fromkeys(found) if c != model_dir.resolve()]
    if found:
        return message + f"; prepared models exist at {found[0]}: point KEYRANK_MODEL_DIR (--model-dir, model_dir=) there"
    return message + f"; looked also in {', '.join(str(c) for c in dict.fromkeys(candidates))}: run `keyrank prepare --out {model_dir}`"
