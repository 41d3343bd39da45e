"""`keyrank serve` as a user runs it: a real process tree, real signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from process_tree import alive, children, free_port

pytestmark = pytest.mark.triton


def _wait_ready(url: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pytest.fail(f"{url} never became ready")


@pytest.fixture()
def serve(prepared_models: Path):
    port = free_port()
    # No embedded ports given: the defaults are free ones.
    env = {**os.environ, "KEYRANK_MODEL_DIR": str(prepared_models), "KEYRANK_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "keyrank.cli", "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _triton_tree(serve_pid: int) -> list[int]:
    tritons = [p for p in children(serve_pid) if "tritonserver" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    assert len(tritons) == 1
    return tritons + children(tritons[0])  # the server and its Python backend stubs


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stop_signal_stops_gateway_and_triton_leaving_no_process(serve, sig):
    proc, url = serve
    assert httpx.post(f"{url}/rerank", json={"query": "cheese", "documents": ["milk makes cheese", "cars"]}).status_code == 200
    tree = _triton_tree(proc.pid)
    assert len(tree) >= 2
    proc.send_signal(sig)
    assert proc.wait(30) == 0
    deadline = time.monotonic() + 10
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in tree if alive(p)]


def test_serve_prints_one_line_per_phase(serve):
    proc, _ = serve
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    phases = [line for line in output.splitlines() if line.startswith("keyrank serve: ")]
    assert [line.split(":")[1].split()[0] for line in phases] == ["starting", "embedded", "gateway"], phases


def test_a_taken_embedded_port_fails_at_once_naming_the_setting(prepared_models):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        env = {**os.environ, "KEYRANK_MODEL_DIR": str(prepared_models), "KEYRANK_PORT": str(free_port()),
               "KEYRANK_EMBEDDED_GRPC_PORT": str(taken)}
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "keyrank.cli", "serve"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1
    assert f"port {taken} (KEYRANK_EMBEDDED_GRPC_PORT) is taken by another process" in out.stderr
    assert "Traceback" not in out.stderr
    assert time.monotonic() - t0 < 30  # no Triton was started, let alone restarted


def test_a_wrong_model_folder_says_where_it_looked_and_where_the_models_are(prepared_models, tmp_path):
    env = {**os.environ, "KEYRANK_MODEL_DIR": "models", "KEYRANK_PORT": str(free_port())}
    out = subprocess.run([sys.executable, "-m", "keyrank.cli", "serve"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1
    assert str(tmp_path / "models" / "triton-embedded" / "cross_encoder" / "config.pbtxt") in out.stderr
    checkout_models = Path(__file__).resolve().parents[1] / "models"  # what `make prepare` fills
    if (checkout_models / "triton-embedded" / "cross_encoder" / "config.pbtxt").exists():
        assert f"prepared models exist at {checkout_models}" in out.stderr
        assert "keyrank prepare" not in out.stderr
    else:
        assert "run `keyrank prepare --out " in out.stderr
