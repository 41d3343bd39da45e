"""Run strategies over evaluation queries through the real ``Reranker`` path.

Every ranking goes through ``Reranker.arank`` exactly as a /rerank request
would (same tokenizer, segmentation, selectors, Triton scoring), so the
numbers measure the service, not a re-implementation of it. What comes back
per query is kept whole: scores per candidate, usage, per-stage timings and
the evidence spans; the report computes everything else from these.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from keyrank.data.queries import EvalQuery
from keyrank.data.runs import QueryRun
from keyrank.pipeline import RerankOptions
from keyrank.strategies import REGISTRY


@dataclass(frozen=True, slots=True)
class System:
    """One configuration under test: a strategy and, for keyb2, its selector."""

    strategy: str
    """firstp, maxp, sump, avgp, parade-max, parade-avg or keyb2."""
    selector: str | None = None
    """bm25, dense or cross; only for keyb2."""

    @property
    def name(self) -> str:
        """How runs and tables name it: ``keyb2-bm25``, ``maxp``."""
        return f"{self.strategy}-{self.selector}" if self.selector else self.strategy


def systems(strategies: Iterable[str], selectors: Iterable[str]) -> list[System]:
    """A strategy that selects (keyb2) once per selector, every other strategy once."""
    out: list[System] = []
    for strategy in strategies:
        if REGISTRY[strategy].needs_selector:
            out.extend(System(strategy, s) for s in selectors)
        else:
            out.append(System(strategy))
    return out


async def rank_query(reranker, system: System, query: EvalQuery, *, timeout_s: float | None) -> QueryRun:
    """One ranking request for one query; failures are recorded, not raised, so a run finishes."""
    run = QueryRun(qid=query.qid, system=system.name)
    ids = [c.doc_id for c in query.candidates]
    started = time.perf_counter()
    try:
        options = RerankOptions(strategy=system.strategy, selector=system.selector, top_n=len(ids), timeout_s=timeout_s)
        ranking = await reranker.arank(query.query, [c.text for c in query.candidates], options)
    except Exception as exc:  # noqa: BLE001 - any failure is a measured outcome of the service
        run.error = f"{type(exc).__name__}: {exc}"
        run.wall_ms = (time.perf_counter() - started) * 1e3
        return run
    run.wall_ms = (time.perf_counter() - started) * 1e3
    for result in ranking.results:
        doc_id = ids[result.index]
        run.scores[doc_id] = float(result.score)
        # The block/window index is ``piece`` in keyrank.reranker (``block`` in its first contract).
        run.evidence[doc_id] = [(e.start, e.end, getattr(e, "piece", getattr(e, "block", None))) for e in result.evidence]
    usage = ranking.usage
    run.scored_sequences = usage.scored_sequences
    run.scored_tokens = usage.scored_tokens
    run.document_tokens = usage.document_tokens
    run.truncated_documents = usage.truncated_documents
    run.timings_ms = dict(ranking.timings_ms)
    return run


async def run_system(reranker, system: System, queries: Sequence[EvalQuery], *, concurrency: int = 1, timeout_s: float | None = None, label: str = "",
                     progress: bool = True) -> list[QueryRun]:
    """All queries for one system, ``concurrency`` requests in flight, results in query order.

    ``concurrency=1`` keeps per-query wall times free of queueing (the
    latency view); more keeps a GPU busy (the throughput view)."""
    from tqdm.auto import tqdm  # the eval extra's: imported by a run, not by `keyrank eval --help`

    bar = tqdm(total=len(queries), desc=f"{label}{system.name}", unit="q", disable=not progress, leave=True)
    limit = asyncio.Semaphore(max(1, concurrency))

    async def one(query: EvalQuery) -> QueryRun:
        async with limit:
            run = await rank_query(reranker, system, query, timeout_s=timeout_s)
        bar.update(1)
        if run.error:
            bar.set_postfix_str(run.error[:60])
        return run

    try:
        return list(await asyncio.gather(*(one(q) for q in queries)))
    finally:
        bar.close()


async def run_task(reranker, systems_: Sequence[System], queries: Sequence[EvalQuery], *, task: str,
                   concurrency: int = 1, timeout_s: float | None = None,
                   progress: bool = True, checkpoints: Path | None = None, key: str = "") -> dict[str, list[QueryRun]]:
    """Every system on one task's queries: {system name: runs}.

    With ``checkpoints``, each finished system is written there at once, and a system already
    written under the same ``key`` (model, settings, queries) is read back instead of run again:
    a full-split run that is stopped loses at most the system it was on."""
    out: dict[str, list[QueryRun]] = {}
    for system in systems_:
        path = None if checkpoints is None else checkpoints / f"{task}.{system.name}.json"
        if path is not None and path.exists():
            saved = json.loads(path.read_text())
            if saved.get("key") == key and len(saved["runs"]) == len(queries):
                out[system.name] = [QueryRun.from_json(r) for r in saved["runs"]]
                print(f"{task}: {system.name} read back from {path}", file=sys.stderr)
                continue
        out[system.name] = await run_system(reranker, system, queries, concurrency=concurrency,
                                            timeout_s=timeout_s, label=f"{task}: ", progress=progress)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"key": key, "runs": [r.to_json() for r in out[system.name]]}))
            tmp.replace(path)
    return out
