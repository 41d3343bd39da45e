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
after their pipeline is loaded and warm. The ways run interleaved, round by round
(median of ``rounds``), and besides wall time each reports its CPU seconds per
request (all processes and threads, pickling included): on a machine shared with
other work, wall time mostly says how many processes the scheduler favoured,
while cores / CPU seconds per request is the ceiling each way has on idle cores.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from keyrank.bench.workloads import candidate_documents
from keyrank.config import get_settings
from keyrank.cores import thread_count, usable_cores
from keyrank.pipeline import Pipeline, RerankOptions

OPTIONS = RerankOptions(strategy="keyb2", selector="bm25")


def _pipeline(model_dir: Path, workers: int = 1) -> Pipeline:
    """A cold pipeline of one of ``workers`` processes (its tokenize_word_cache choice is a worker's)."""
    return Pipeline.from_model_dir(get_settings().with_overrides(model_dir=model_dir, document_cache_bytes=0, workers=workers))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _worker(model_dir: Path, query: str, docs: list[str], n: int, options: RerankOptions, rounds: int, workers: int,
            ready, barrier, done) -> None:
    pipeline = _pipeline(model_dir, workers)
    pipeline.plan(query, docs, options)
    ready.put(os.getpid())
    for _ in range(rounds):
        barrier.wait()
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            pipeline.plan(query, docs, options)
        done.put((start, time.perf_counter(), time.process_time() - cpu))


class WorkerProcesses:
    """``n`` spawned processes, each with its own pipeline taking whole requests (uvicorn workers)."""

    def __init__(self, model_dir: Path, query: str, docs: list[str], requests: int, n: int, options: RerankOptions, rounds: int):
        ctx = mp.get_context("spawn")
        self._ready, self._done, self._barrier = ctx.Queue(), ctx.Queue(), ctx.Barrier(n + 1)
        shares = [requests // n + (i < requests % n) for i in range(n)]
        args = (self._ready, self._barrier, self._done)
        self._procs = [ctx.Process(target=_worker, args=(model_dir, query, docs, k, options, rounds, n, *args)) for k in shares]
        for p in self._procs:
            p.start()
        for _ in self._procs:
            self._ready.get(timeout=300)

    def round(self) -> tuple[float, float]:
        """(wall, CPU) seconds of one round: all processes start together, loaded and warm. The wall time runs from
        the first worker's start to the last one's end, both read by the workers (a worker may finish a short round
        before this process is scheduled again past the barrier)."""
        self._barrier.wait()
        rounds = [self._done.get(timeout=600) for _ in self._procs]
        return max(e for _, e, _ in rounds) - min(s for s, _, _ in rounds), sum(c for _, _, c in rounds)

    def close(self) -> None:
        for p in self._procs:
            p.join(timeout=60)


def worker_processes(model_dir: Path, query: str, docs: list[str], requests: int, n: int, options: RerankOptions = OPTIONS) -> tuple[float, float]:
    """(wall, CPU) seconds for ``n`` spawned processes to preprocess ``requests`` requests between them."""
    workers = WorkerProcesses(model_dir, query, docs, requests, n, options, rounds=1)
    try:
        return workers.round()
    finally:
        workers.close()


_POOL_PIPELINE: Pipeline | None = None


def _pool_init(model_dir: Path) -> None:
    global _POOL_PIPELINE
    _POOL_PIPELINE = _pipeline(model_dir)


def _pool_plan(query: str, docs: list[str]):
    """What the gateway process needs back: the model inputs, the passages, the cuts (not the texts)."""
    plan = _POOL_PIPELINE.plan(query, docs, OPTIONS)  # type: ignore[union-attr]
    return plan.inputs, plan.passages, plan.truncated


def pool_round(executor: ProcessPoolExecutor, query: str, docs: list[str], requests: int) -> tuple[float, float]:
    """(wall, CPU) seconds: the sending process's CPU and the pool processes' (pickling included)."""
    pids = list(executor._processes)  # the pool keeps no public list of its processes
    before = sum(_cpu_seconds(pid) for pid in pids)
    t0, cpu = time.perf_counter(), time.process_time()
    list(executor.map(_pool_plan, [query] * requests, [docs] * requests))
    wall, own = time.perf_counter() - t0, time.process_time() - cpu
    return wall, own + sum(_cpu_seconds(pid) for pid in pids) - before


def serial(pipeline: Pipeline, query: str, docs: list[str], requests: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one process doing the requests one after another."""
    t0, cpu = time.perf_counter(), time.process_time()
    for _ in range(requests):
        pipeline.plan(query, docs, OPTIONS)
    return time.perf_counter() - t0, time.process_time() - cpu


def threads(pipeline: Pipeline, query: str, docs: list[str], requests: int, n: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one process doing ``n`` requests at a time on threads."""
    with ThreadPoolExecutor(n) as pool:
        t0, cpu = time.perf_counter(), time.process_time()
        list(pool.map(lambda _: pipeline.plan(query, docs, OPTIONS), range(requests)))
        return time.perf_counter() - t0, time.process_time() - cpu


def run(model_dir: Path, datasets: Path, *, candidates: int = 100, requests: int = 12, workers: int = 0, rounds: int = 3) -> dict:
    """Every way ``rounds`` times, interleaved round by round (load drift hits all alike); medians."""
    n = workers or thread_count()
    pipeline = _pipeline(model_dir)
    docs, queries = candidate_documents(datasets, pipeline.tokenizer, candidates)
    query = queries[0]
    tokens = sum(len(d) for d in pipeline.encode(query, docs)[1])
    pipeline.plan(query, docs, OPTIONS)
    load = os.getloadavg()[0]
    timings: dict[str, list[tuple[float, float]]] = {"serial": [], "threads": [], "workers": [], "pool": []}
    # The processes of the other ways wait idle (blocked) while one way runs.
    procs = WorkerProcesses(model_dir, query, docs, requests, n, OPTIONS, rounds)
    with ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"), initializer=_pool_init, initargs=(model_dir,)) as executor:
        list(executor.map(_pool_plan, [query] * (2 * n), [docs] * (2 * n)))  # load and warm every pool process
        for _ in range(rounds):
            timings["serial"].append(serial(pipeline, query, docs, requests))
            timings["threads"].append(threads(pipeline, query, docs, requests, n))
            timings["workers"].append(procs.round())
            timings["pool"].append(pool_round(executor, query, docs, requests))
    procs.close()
    cores = usable_cores()
    median = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in timings.items()}
    return {
        "cores": cores, "processes": n, "requests": requests, "candidates": candidates, "tokens_per_request": tokens,
        "rounds": rounds, "load_before": load, "load_after": os.getloadavg()[0],
        "ways": {
            k: {
                "seconds": wall, "requests_per_s": requests / wall, "vs_serial": median["serial"][0] / wall,
                "cpu_s_per_request": cpu / requests,
                # All cores at this CPU cost per request: what the way reaches with the machine to itself.
                "ceiling_requests_per_s": cores * requests / cpu,
            }
            for k, (wall, cpu) in median.items()
        },
    }


def print_table(result: dict) -> None:
    print(f"keyb2/bm25 preprocessing, {result['requests']} requests x {result['candidates']} documents "
          f"({result['tokens_per_request']:,} tokens each), {result['processes']} processes/threads on {result['cores']:g} cores "
          f"(load average {result['load_before']:.1f} -> {result['load_after']:.1f}), median of {result['rounds']} interleaved rounds")
    print(f"{'way':<10}{'req/s':>8}{'vs serial':>11}{'CPU s/req':>11}{'ceiling req/s':>15}")
    for name, row in result["ways"].items():
        print(f"{name:<10}{row['requests_per_s']:>8.2f}{row['vs_serial']:>10.2f}x{row['cpu_s_per_request']:>11.3f}{row['ceiling_requests_per_s']:>15.2f}")
    print("ceiling = cores / CPU seconds per request: what each way reaches with the cores to itself")
