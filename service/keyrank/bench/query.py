"""`keyrank bench --query`: the whole query on CPU, keyrank against do-it-yourself MaxP with the fastest peer.

What a user compares is a query: 100 candidates of ~2k tokens (consecutive stretches of QMSum
transcripts). keyrank ranks it with keyb2 (BM25 selection, one 512-token sequence per document) and with
maxp (every window), in-process (``Reranker.local``) and through the embedded CPU Triton; the
do-it-yourself baseline is what a user writes with the fastest peer of `keyrank bench --peers`:
sentence-transformers' ``CrossEncoder(backend="openvino")`` over 512-token windows (half-window
stride), a document's score its best window's (``bench/diy.py``). Same checkpoint, same threads, the
document cache off (nothing is seen before); rounds interleaved, every system once per round (the order reversed every other round), the
median round's queries/s reported with the ratio to the DIY baseline, and keyrank's per-stage times
(tokenize/segment, select, infer, aggregate) as the profile.

Beside the speed, the quality of the same systems on QMSum val (``--quality-queries``, all 237 by
default: each query's ~9 candidate segments of ~1.5k tokens, as `keyrank eval --task qmsum` builds them):
nDCG@10 from ir-measures, keyrank in-process (the Triton path returns the same scores, tests/test_triton_scoring.py).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from keyrank.bench.peers import SETTLE_S, round_order

KEYRANK = (("keyb2", "bm25"), ("maxp", None))
"""keyrank's strategies in the comparison: the default (keyb2 with BM25) and the one the DIY baseline re-implements."""
DEADLINE_S = 3600.0
"""The deadline of one benchmark query (the serving default, 30 s, is for requests, not for measuring)."""
DIY = "do-it-yourself MaxP, sentence-transformers backend=\"openvino\""


def parse_systems(names: Sequence[str]) -> tuple[tuple[str, str | None], ...]:
    """``keyb2-bm25``, ``maxp``, ``cedr-knrm``: a registry strategy, or one that selects followed by its selector
    (a selecting strategy named alone gets ``bm25``)."""
    from keyrank.strategies import REGISTRY

    out = []
    for name in names:
        strategy, _, selector = name.rpartition("-")
        if name in REGISTRY:
            out.append((name, "bm25" if REGISTRY[name].needs_selector else None))
        elif strategy in REGISTRY and REGISTRY[strategy].needs_selector:
            out.append((strategy, selector))
        else:
            raise SystemExit(f"--strategies: {name!r} is neither a strategy ({', '.join(sorted(REGISTRY))}) "
                             "nor a selecting strategy with its selector (keyb2-bm25)")
    return tuple(out)


def _name(path: str, strategy: str, selector: str | None) -> str:
    return f"keyrank {path}, {strategy}{'-' + selector if selector else ''}"


def keyrank_systems(model_dir: Path, threads: int, paths: Sequence[str], strategies=KEYRANK, closers: list | None = None
                    ) -> dict[str, Callable[[str, list[str]], tuple[np.ndarray, dict]]]:
    """keyrank's rankers by row name: each returns the documents' scores (by index) and the stage times."""
    from keyrank import Reranker
    from keyrank.config import get_settings

    # A 100 x 2k maxp query is ~800 sequences: minutes on 2 loaded cores, past the serving deadline.
    settings = get_settings().with_overrides(model_dir=model_dir, document_cache_bytes=0, request_timeout_s=DEADLINE_S)
    out = {}
    for path in paths:
        if path == "local":
            reranker = Reranker.local(model_dir, settings, threads=threads)
        else:
            os.environ["KEYRANK_EMBEDDED_ORT_THREADS"] = str(threads)
            reranker = Reranker.embedded(settings, embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
        if closers is not None:
            closers.append(reranker.close)
        for strategy, selector in strategies:
            out[_name("in-process" if path == "local" else "embedded Triton", strategy, selector)] = _ranker(reranker, strategy, selector)
    return out


def _ranker(reranker, strategy: str, selector: str | None):
    def rank(query: str, docs: list[str]) -> tuple[np.ndarray, dict]:
        ranking = reranker.rank(query, docs, strategy=strategy, selector=selector, top_n=len(docs), timeout_s=DEADLINE_S)
        scores = np.empty(len(docs))
        for r in ranking.results:
            scores[r.index] = r.score
        return scores, {**ranking.timings_ms, "sequences": ranking.usage.scored_sequences, "tokens": ranking.usage.scored_tokens}
    return rank


def diy_system(checkpoint: Path, threads: int, backend: str = "openvino"):
    from keyrank.bench.diy import DiyMaxP

    diy = DiyMaxP(checkpoint, "cpu", backend=backend, threads=threads, batch_size=32)

    def rank(query: str, docs: list[str]) -> tuple[np.ndarray, dict]:
        scores, timings = diy.rank_timed(query, docs)
        return scores.astype(np.float64), timings
    return rank


# --- arithmetic (pinned by tests/test_bench.py) -------------------------------------------------------


def summarize(seconds: dict[str, list[float]], queries_per_round: int, reference: str) -> dict[str, dict]:
    """Per system: queries/s of its median round and the ratio to ``reference``'s."""
    rows = {name: {"median_s": statistics.median(times), "rounds": len(times)} for name, times in seconds.items()}
    for row in rows.values():
        row["qps"] = queries_per_round / row["median_s"]
    base = rows[reference]["qps"] if reference in rows else None
    for row in rows.values():
        if base:
            row["vs_diy"] = row["qps"] / base
    return rows


def profile(stages: list[dict]) -> dict[str, float]:
    """Median milliseconds per stage (and sequences per query) over a system's queries."""
    keys = sorted({k for s in stages for k in s})
    return {k: float(statistics.median(s.get(k, 0.0) for s in stages)) for k in keys}


# --- quality on QMSum val -------------------------------------------------------------------------------


def quality(systems: dict[str, Callable], datasets: Path, tokenizer, *, max_queries: int | None = None,
            progress: Callable[[str], None] = lambda _: None) -> dict[str, dict]:
    """nDCG@10 (ir-measures) of each system on QMSum val, the queries `keyrank eval --task qmsum` builds (seed 0)."""
    from keyrank.data import qmsum
    from keyrank.data.queries import subsample
    from keyrank.data.runs import QueryRun, per_query

    # What `keyrank eval --task qmsum` builds (evaluation/tasks.py), from the data room: the tools never import one another.
    queries = subsample(qmsum.build(datasets, tokenizer, split="val", seed=0), max_queries, 0)
    out = {}
    for name, rank in systems.items():
        runs, started = [], time.perf_counter()
        for query in queries:
            scores, _ = rank(query.query, [c.text for c in query.candidates])
            runs.append(QueryRun(qid=query.qid, system=name, scores={c.doc_id: float(s) for c, s in zip(query.candidates, scores)}))
        values = per_query(queries, runs, ["nDCG@10"])
        out[name] = {"ndcg@10": float(np.mean([values[q.qid]["nDCG@10"] for q in queries])), "queries": len(queries),
                     "per_query": {q.qid: values[q.qid]["nDCG@10"] for q in queries}, "seconds": time.perf_counter() - started}
        progress(f"{name}: nDCG@10 {out[name]['ndcg@10']:.4f} on {len(queries)} queries ({out[name]['seconds']:.0f} s)")
    return out


# --- the run ----------------------------------------------------------------------------------------------


def run(model_dir: Path, datasets: Path, checkpoint: Path, *, threads: int = 2, rounds: int = 3, candidates: int = 100,
        requests: int = 2, paths: Sequence[str] = ("local", "triton"), quality_queries: int | None = None,
        quality_systems: Sequence[str] = ("keyb2", "diy"), settle_s: float = SETTLE_S, diy: bool = True,
        strategies: Sequence[tuple[str, str | None]] = KEYRANK) -> dict:
    """Speed (interleaved rounds of ``requests`` queries of ``candidates`` ~2k-token documents) and, unless
    ``quality_queries`` is 0, nDCG@10 on QMSum val of keyrank keyb2 in-process and the DIY baseline
    (``quality_systems``: ``diy`` or keyrank's in-process rows by the ``strategies`` names, e.g. keyb2-bm25, maxp). ``rounds`` 0: the quality alone (a separate, long run). ``diy``
    False: keyrank's rows only (no sentence-transformers needed; no ratio to the DIY). ``strategies``: keyrank's
    rows, (strategy, selector) pairs (``parse_systems``)."""
    from keyrank.bench.workloads import candidate_documents
    from keyrank.config import Settings
    from keyrank.pipeline import Pipeline
    from keyrank.prepare.variants import served_variant

    tokenizer = Pipeline.from_model_dir(Settings(model_dir=model_dir)).tokenizer
    pool, queries = candidate_documents(datasets, tokenizer, candidates * requests, tokens=2000)
    if len(pool) < candidates * requests:
        raise SystemExit(f"only {len(pool)} documents of 2,000 tokens under {datasets}")
    load = [(queries[i * 7 % len(queries)], pool[i * candidates:(i + 1) * candidates]) for i in range(requests)]
    closers: list = []
    try:
        systems = {DIY: diy_system(checkpoint, threads)} if diy else {}
        systems.update(keyrank_systems(model_dir, threads, paths if rounds else ("local",), strategies, closers=closers))
        for rank in systems.values() if rounds else ():
            rank(load[0][0], load[0][1][:4])  # warm-up: first shapes, lazy loads
        seconds = {name: [] for name in systems}
        stages: dict[str, list[dict]] = {name: [] for name in systems}
        for r in range(rounds):
            for name in round_order(list(systems), r):
                rank = systems[name]
                time.sleep(settle_s)
                started = time.perf_counter()
                for query, docs in load:
                    stages[name].append(rank(query, docs)[1])
                seconds[name].append(time.perf_counter() - started)
        load_average = os.getloadavg()
        quality_rows = {}
        if quality_queries != 0:
            local = "in-process"
            wanted = {s: DIY if s == "diy" else _name(local, *parse_systems([s])[0])
                      for s in quality_systems}
            missing = [s for s, name in wanted.items() if name not in systems]
            if missing:
                raise SystemExit(f"--quality-systems {' '.join(missing)}: not among the rows measured (give them to "
                                 f"--strategies, or drop --no-diy)")
            chosen = {name: systems[name] for name in wanted.values()}
            quality_rows = quality(chosen, datasets, tokenizer, max_queries=quality_queries,
                                   progress=lambda line: print(line, file=sys.stderr, flush=True))
    finally:
        for close in reversed(closers):
            close()
    rows = summarize(seconds, requests, DIY) if rounds else {name: {"profile_ms": {}} for name in quality_rows}
    for name, row in rows.items():
        row["profile_ms"] = profile(stages[name]) if rounds else {}
        if name in quality_rows:
            row["ndcg@10"] = quality_rows[name]["ndcg@10"]
    return {"threads": threads, "rounds": rounds, "requests_per_round": requests, "candidates": candidates,
            "document_tokens": 2000, "load_average": load_average, "keyrank_cpu_variant": served_variant(model_dir),
            "systems": rows, "quality": {k: {x: v[x] for x in ("ndcg@10", "queries", "seconds")} for k, v in quality_rows.items()},
            "quality_per_query": {k: v["per_query"] for k, v in quality_rows.items()}}


def print_table(result: dict) -> None:
    print(f"threads {result['threads']}, {result['rounds']} interleaved rounds of {result['requests_per_round']} queries x "
          f"{result['candidates']} candidates of ~{result['document_tokens']} tokens (median round), document cache off, load average "
          f"{', '.join(f'{x:.1f}' for x in result['load_average'])}; keyrank's CPU variant: {result['keyrank_cpu_variant']}")
    quality = result.get("quality") or {}
    if quality:
        n = next(iter(quality.values()))["queries"]
        print(f"nDCG@10: QMSum val, {n} queries (keyrank in-process; the Triton path scores the same)")
    print("| system | queries/s | vs DIY MaxP | sequences/query | tokens/query | nDCG@10 QMSum val | profile: median ms per query |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, row in result["systems"].items():
        p = dict(row["profile_ms"])
        sequences, tokens = p.pop("sequences", None), p.pop("tokens", None)
        ndcg = row.get("ndcg@10")
        if ndcg is None and name.startswith("keyrank embedded Triton"):
            twin = quality.get(name.replace("embedded Triton", "in-process"))
            ndcg = twin and twin["ndcg@10"]
        stages = ", ".join(f"{k} {v:.0f}" for k, v in p.items())
        vs_diy = f"{row['vs_diy']:.2f}x" if "vs_diy" in row else "-"
        qps = f"{row['qps']:.3f} | {vs_diy}" if "qps" in row else "- | -"
        print(f"| {name} | {qps} | {'-' if sequences is None else f'{sequences:.0f}'} | {'-' if tokens is None else f'{tokens:,.0f}'} | "
              f"{'-' if ndcg is None else f'{ndcg:.3f}'} | {stages} |")
