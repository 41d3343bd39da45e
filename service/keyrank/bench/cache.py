"""`keyrank bench --cache`: the document cache on repeated candidates, in one run.

1. Every document seen before: one request of ``candidates`` QMSum documents of
   ~2k tokens, preprocessed (``Pipeline.plan``: tokenize, segment, select,
   assemble) by a pipeline without the cache (cold) and by one whose cache
   already holds them (warm); median of ``repeats`` each, ratio cold / warm.
2. Popular documents: ``requests`` requests drawing their candidates from a
   pool by Zipf popularity (s = 1), as a search backend's results repeat; hit
   rate and total preprocessing time against the same requests cold.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from keyrank.bench.workloads import candidate_documents
from keyrank.config import get_settings
from keyrank.pipeline import Pipeline, RerankOptions

CASES = (("keyb2-blocks", "bm25"), ("keyb2", "bm25"), ("maxp", None), ("firstp", None))


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def _pipelines(model_dir: Path, cache_bytes: int) -> tuple[Pipeline, Pipeline]:
    settings = get_settings().with_overrides(model_dir=model_dir)
    return (Pipeline.from_model_dir(settings.with_overrides(document_cache_bytes=0)),
            Pipeline.from_model_dir(settings.with_overrides(document_cache_bytes=cache_bytes)))


def seen_before(cold: Pipeline, warm: Pipeline, query: str, docs: list[str], repeats: int) -> dict:
    """Per strategy: median ms cold, median ms with every document cached, and the ratio."""
    rows = {}
    for strategy, selector in CASES:
        options = RerankOptions(strategy=strategy, selector=selector)
        cold.plan(query, docs, options)  # warm-up of the code paths (numba, allocator), not of a cache
        warm.plan(query, docs, options)  # fills the cache: from here on every document was seen before
        cold_ms = _median_ms(lambda o=options: cold.plan(query, docs, o), repeats)
        warm_ms = _median_ms(lambda o=options: warm.plan(query, docs, o), repeats)
        rows[strategy + (f"/{selector}" if selector else "")] = {"cold_ms": cold_ms, "warm_ms": warm_ms, "speedup": cold_ms / warm_ms}
    return rows


def popular(cold: Pipeline, warm: Pipeline, queries: list[str], pool: list[str], candidates: int, requests: int, seed: int = 0) -> dict:
    """Zipf-popular candidates (keyb2/bm25): hit rate and preprocessing time, cache against none."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(pool) + 1)
    weights /= weights.sum()
    draws = [rng.choice(len(pool), size=min(candidates, len(pool)), replace=False, p=weights) for _ in range(requests)]
    options = RerankOptions(strategy="keyb2", selector="bm25")
    hits0, misses0 = warm.documents.hits, warm.documents.misses
    timings = {}
    for name, pipeline in (("cold", cold), ("cached", warm)):
        t0 = time.perf_counter()
        for i, rows in enumerate(draws):
            pipeline.plan(queries[i % len(queries)], [pool[j] for j in rows], options)
        timings[name] = time.perf_counter() - t0
    hits, misses = warm.documents.hits - hits0, warm.documents.misses - misses0
    return {
        "pool": len(pool), "requests": requests, "candidates": candidates, "hit_rate": hits / max(1, hits + misses),
        "cold_s": timings["cold"], "cached_s": timings["cached"], "speedup": timings["cold"] / timings["cached"],
        "cache_mb": warm.documents.bytes / 1e6, "cached_documents": len(warm.documents),
    }


def run(model_dir: Path, datasets: Path, *, candidates: int = 100, repeats: int = 5, pool: int = 300, requests: int = 20,
        cache_bytes: int = 256 * 2**20) -> dict:
    cold, warm = _pipelines(model_dir, cache_bytes)
    docs, queries = candidate_documents(datasets, cold.tokenizer, max(pool, candidates))
    tokens = sum(len(d) for d in cold.encode(queries[0], docs[:candidates])[1])
    result = {
        "candidates": candidates, "document_tokens": tokens, "repeats": repeats,
        "seen_before": seen_before(cold, warm, queries[0], docs[:candidates], repeats),
    }
    if requests > 0:
        _, fresh = _pipelines(model_dir, cache_bytes)  # an empty cache: the hit rate starts from zero
        result["popular"] = popular(cold, fresh, queries, docs[:pool], candidates, requests)
    return result


def print_table(result: dict) -> None:
    print(f"one request of {result['candidates']} QMSum documents ({result['document_tokens']:,} tokens), "
          f"preprocessing median of {result['repeats']}: cold vs every document seen before")
    print(f"{'strategy':<19}{'cold ms':>10}{'cached ms':>11}{'speedup':>9}")
    for name, row in result["seen_before"].items():
        print(f"{name:<19}{row['cold_ms']:>10.1f}{row['warm_ms']:>11.1f}{row['speedup']:>8.1f}x")
    if "popular" in result:
        p = result["popular"]
        print(f"popular documents (keyb2/bm25): {p['requests']} requests x {p['candidates']} candidates drawn by Zipf(1) "
              f"from {p['pool']}: hit rate {p['hit_rate']:.0%}, {p['cold_s']:.1f} s cold vs {p['cached_s']:.1f} s cached "
              f"({p['speedup']:.1f}x), cache {p['cache_mb']:.1f} MB for {p['cached_documents']} documents")
