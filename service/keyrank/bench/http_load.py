"""Load through real HTTP for `keyrank bench --gpu`: a gateway in a child process, latency at
concurrency 1 and throughput at saturation, with bodies built once (the client must not be
what is measured)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway(command: Sequence[str], env: dict[str, str], port: int, log: Path, ready_timeout_s: float = 300) -> Iterator[str]:
    """Run ``command`` (a gateway listening on ``port``) until the block ends; yields its URL."""
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(list(command), env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {proc.returncode}; see {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"gateway not ready in {ready_timeout_s:.0f} s; see {log}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def bodies(queries: Sequence[str], pool: Sequence[str], strategy: str, selector: str | None, count: int, candidates: int, seed: int = 0) -> list[bytes]:
    """``count`` request bodies, each ``candidates`` distinct documents drawn from ``pool``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        docs = [pool[j] for j in rng.choice(len(pool), size=min(candidates, len(pool)), replace=False)]
        body = {"query": queries[i % len(queries)], "documents": docs, "strategy": strategy, "top_n": 10}
        if selector:
            body["selector"] = selector
        out.append(json.dumps(body).encode())
    return out


async def _post(client: httpx.AsyncClient, url: str, body: bytes) -> float:
    t0 = time.perf_counter()
    response = await client.post(f"{url}/rerank", content=body, headers={"content-type": "application/json"})
    if response.status_code != 200:
        raise RuntimeError(f"/rerank answered {response.status_code}: {response.text[:300]}")
    return time.perf_counter() - t0


def latency(url: str, bodies_: Sequence[bytes], n: int, warmup: int = 3) -> dict:
    """p50/p99 ms of ``n`` requests one after another (concurrency 1)."""

    async def go() -> list[float]:
        async with httpx.AsyncClient(timeout=120) as client:
            for i in range(warmup):
                await _post(client, url, bodies_[i % len(bodies_)])
            return [await _post(client, url, bodies_[i % len(bodies_)]) for i in range(n)]

    times = np.asarray(asyncio.run(go())) * 1000
    return {"requests": n, "p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)), "mean_ms": float(times.mean())}


def saturation(url: str, bodies_: Sequence[bytes], concurrency: int, duration_s: float) -> dict:
    """Queries/s with ``concurrency`` requests always in flight for ``duration_s`` seconds."""

    async def go() -> tuple[int, float, list[float]]:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            done, times, counter = 0, [], iter(range(10**9))
            t_end = time.perf_counter() + duration_s

            async def loop() -> None:
                nonlocal done
                while time.perf_counter() < t_end:
                    times.append(await _post(client, url, bodies_[next(counter) % len(bodies_)]))
                    done += 1

            t0 = time.perf_counter()
            await asyncio.gather(*(loop() for _ in range(concurrency)))
            return done, time.perf_counter() - t0, times

    done, seconds, times = asyncio.run(go())
    ms = np.asarray(times) * 1000
    return {"concurrency": concurrency, "requests": done, "seconds": seconds, "qps": done / seconds,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def keyrank_serve(model_dir: Path, port: int, triton_url: str, workers: int) -> list[str]:
    return [sys.executable, "-m", "keyrank.cli", "serve", "--model-dir", str(model_dir), "--port", str(port),
            "--triton-url", triton_url, "--workers", str(workers)]


def torch_gateway(model_dir: Path, port: int, device: str) -> list[str]:
    return [sys.executable, "-m", "keyrank.modelserver.gpu_gateway", "--model-dir", str(model_dir), "--port", str(port), "--device", device]
