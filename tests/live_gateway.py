"""A real uvicorn gateway on a free loopback port, for tests that need their own settings."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import uvicorn
from keyrank.api import create_app
from keyrank.config import Settings
from process_tree import stop


@contextlib.contextmanager
def live_gateway(settings: Settings) -> Iterator[str]:
    """The gateway's base URL while the block runs; stopped (connections closed) after it."""
    with serving(create_app(settings), ready_path="/healthz") as url:
        yield url


@contextlib.contextmanager
def gateway_process(settings: dict[str, object]) -> Iterator[str]:
    """The gateway as it is deployed, ``keyrank serve`` in a process of its own, with these settings (``{name:
    value}``, as ``KEYRANK_<NAME>``; with ``triton_url`` it starts no Triton), not sharing an interpreter with the
    test's client: for timings. Its base URL once ready; stopped after."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "KEYRANK_PORT": str(port)}
    env.update({f"KEYRANK_{name.upper()}": str(value) for name, value in settings.items()})
    proc = subprocess.Popen([sys.executable, "-m", "keyrank.cli", "serve"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"keyrank serve did not become ready: {proc.stderr.read() if proc.poll() is not None else ''}")
            time.sleep(0.1)
        yield url
    finally:
        stop(proc)


@contextlib.contextmanager
def serving(app, ready_path: str = "/healthz", **options) -> Iterator[str]:
    """``app`` on a real uvicorn (``options``: more of uvicorn's Config, e.g. its ``http`` protocol), free
    loopback port, once ``ready_path`` answers 200; its base URL while the block runs."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options))
    thread = threading.Thread(target=server.run, name=f"gateway-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}{ready_path}", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"gateway did not answer {ready_path}")
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def metric_samples(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of the gateway's /metrics: {(name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
