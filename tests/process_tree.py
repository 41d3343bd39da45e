"""`keyrank serve` as a real process tree, for the serve and supervision tests: start it,
find its tritonserver and Python backend stubs in /proc, wait for readiness."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

BODY = {"query": "who makes cheese", "documents": ["The farm makes cheese from milk.", "Cars are fast."]}
"""A small rerank request whose right answer is document 0."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (zombies included)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def tritonserver_of(serve_pid: int) -> int:
    """The one live tritonserver that ``serve_pid`` spawned."""
    tritons = [p for p in children(serve_pid) if "tritonserver" in command_line(p) and alive(p)]
    assert len(tritons) == 1, tritons
    return tritons[0]


def stubs_of(triton_pid: int) -> list[int]:
    """The live Python backend stubs (the model processes) of a tritonserver."""
    return [p for p in children(triton_pid) if "triton_python_backend_stub" in command_line(p) and alive(p)]


def wait_status(url: str, path: str, want: int, timeout: float, method: str = "GET", json: dict | None = None) -> float:
    """Poll until ``path`` answers ``want``; the seconds it took (AssertionError past ``timeout``)."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < timeout:
        try:
            last = httpx.request(method, f"{url}{path}", json=json, timeout=max(0.5, timeout / 4)).status_code
            if last == want:
                return time.monotonic() - t0
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.05)
    raise AssertionError(f"{method} {path} never answered {want} within {timeout} s (last: {last})")


def start_serve(models: Path, log: Path, **env: str) -> tuple[subprocess.Popen, str]:
    """`python -m keyrank.cli serve` on a free gateway port (embedded Triton on free ports); output to ``log``."""
    port = free_port()
    environment = {**os.environ, "KEYRANK_MODEL_DIR": str(models), "KEYRANK_PORT": str(port), **env}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "keyrank.cli", "serve"], env=environment,
                                stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the server removes its work dir and shared memory), SIGKILL only if it does not exit."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def guard_serving(check) -> Iterator[str]:
    """The guard sidecar's check (``modelserver/guard.py`` ``ModelPathCheck``) started and answering on a free
    loopback port, as `keyrank guard` serves it: its base URL while the block runs; stopped after."""
    from http.server import ThreadingHTTPServer

    from keyrank.modelserver.guard import _handler

    check.start()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(check))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        check.stopping.set()
