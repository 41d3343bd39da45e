"""`keyrank bench --processes`: preprocessing spread over the cores, four ways, in one run.

The same ``requests`` requests (``candidates`` QMSum documents of ~2k tokens,
keyb2/bm25, document cache off so every request pays the full CPU work) are
preprocessed (``Pipeline.plan``):

- ``serial``: one process, one request after another (the floor);
- ``threads``: one process, N requests at once on threads, as one uvicorn
  worker runs concurrent requests (``asyncio.to_thread``);
- ``workers``: N processes, each with its own pipeline taking whole requests,
  as ``KEYRANK_WORKERS=N`` uvicorn workers do (nothing crosses a process);
- ``pool``: one process sending each request's texts to N pool processes and
  receiving the model inputs back (pickled), as a ProcessPoolExecutor for
  tokenize/segment/select would.

Processes are spawned (as uvicorn spawns its workers) and timed from a barrier
after their pipeline is loaded and warm.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from keyrank.bench.workloads import candidate_documents
from keyrank.config import get_settings
from keyrank.pipeline import Pipeline, RerankOptions

OPTIONS = RerankOptions(strategy="keyb2", selector="bm25")


def _pipeline(model_dir: Path) -> Pipeline:
    return Pipeline.from_model_dir(get_settings().with_overrides(model_dir=model_dir, document_cache_bytes=0))


def _worker(model_dir: Path, query: str, docs: list[str], n: int, options: RerankOptions, ready, start, done) -> None:
    pipeline = _pipeline(model_dir)
    pipeline.plan(query, docs, options)
    ready.put(os.getpid())
    start.wait()
    for _ in range(n):
        pipeline.plan(query, docs, options)
    done.put(time.perf_counter())


_POOL_PIPELINE: Pipeline | None = None


def _pool_init(model_dir: Path) -> None:
    global _POOL_PIPELINE
    _POOL_PIPELINE = _pipeline(model_dir)


def _pool_plan(query: str, docs: list[str]):
    """What the gateway process needs back: the model inputs, the passages, the cuts (not the texts)."""
    plan = _POOL_PIPELINE.plan(query, docs, OPTIONS)  # type: ignore[union-attr]
    return plan.inputs, plan.passages, plan.truncated


def serial(pipeline: Pipeline, query: str, docs: list[str], requests: int) -> float:
    t0 = time.perf_counter()
    for _ in range(requests):
        pipeline.plan(query, docs, OPTIONS)
    return time.perf_counter() - t0


def threads(pipeline: Pipeline, query: str, docs: list[str], requests: int, n: int) -> float:
    with ThreadPoolExecutor(n) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda _: pipeline.plan(query, docs, OPTIONS), range(requests)))
        return time.perf_counter() - t0


def worker_processes(model_dir: Path, query: str, docs: list[str], requests: int, n: int, options: RerankOptions = OPTIONS) -> float:
    """Seconds for ``n`` spawned processes to preprocess ``requests`` requests between them (from a barrier)."""
    ctx = mp.get_context("spawn")
    ready, done, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    shares = [requests // n + (i < requests % n) for i in range(n)]
    procs = [ctx.Process(target=_worker, args=(model_dir, query, docs, k, options, ready, start, done)) for k in shares]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    t0 = time.perf_counter()
    start.set()
    finished = max(done.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    return finished - t0


def process_pool(model_dir: Path, query: str, docs: list[str], requests: int, n: int) -> float:
    with ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"), initializer=_pool_init, initargs=(model_dir,)) as executor:
        list(executor.map(_pool_plan, [query] * (2 * n), [docs] * (2 * n)))  # load and warm every process
        t0 = time.perf_counter()
        list(executor.map(_pool_plan, [query] * requests, [docs] * requests))
        return time.perf_counter() - t0


def run(model_dir: Path, datasets: Path, *, candidates: int = 100, requests: int = 12, workers: int = 0) -> dict:
    n = workers or len(os.sched_getaffinity(0))
    pipeline = _pipeline(model_dir)
    docs, queries = candidate_documents(datasets, pipeline.tokenizer, candidates)
    query = queries[0]
    tokens = sum(len(d) for d in pipeline.encode(query, docs)[1])
    pipeline.plan(query, docs, OPTIONS)
    seconds = {
        "serial": serial(pipeline, query, docs, requests),
        "threads": threads(pipeline, query, docs, requests, n),
        "workers": worker_processes(model_dir, query, docs, requests, n),
        "pool": process_pool(model_dir, query, docs, requests, n),
    }
    return {
        "cores": len(os.sched_getaffinity(0)), "processes": n, "requests": requests, "candidates": candidates,
        "tokens_per_request": tokens,
        "ways": {k: {"seconds": s, "requests_per_s": requests / s, "tokens_per_s": requests * tokens / s,
                     "vs_serial": seconds["serial"] / s} for k, s in seconds.items()},
    }


def print_table(result: dict) -> None:
    print(f"keyb2/bm25 preprocessing, {result['requests']} requests x {result['candidates']} documents "
          f"({result['tokens_per_request']:,} tokens each), {result['processes']} processes/threads on {result['cores']} cores")
    print(f"{'way':<10}{'req/s':>8}{'tokens/s':>12}{'vs serial':>11}")
    for name, row in result["ways"].items():
        print(f"{name:<10}{row['requests_per_s']:>8.2f}{row['tokens_per_s']:>12,.0f}{row['vs_serial']:>10.2f}x")
