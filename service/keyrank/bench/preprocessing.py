"""`keyrank bench`: CPU preprocessing throughput against the raw tokenizer, in one run.

Preprocessing = everything the gateway does before Triton: tokenize (with
offsets) + segment + select + assemble the model inputs. Its speed is compared
with a bare `tokenizers` batch encode of the same texts (the floor any gateway
pays), as document tokens per second, median of ``--repeats`` runs. Also
measured: the CogLTX DP compiled with numba against the same function as plain
Python (``.py_func``), the reason numba is a dependency.

    keyrank bench --model-dir models --docs 20 --repeats 5
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from keyrank.bench.workloads import meeting_documents
from keyrank.config import get_settings
from keyrank.pipeline import Pipeline, RerankOptions
from keyrank.segment import cheapest_cut, blocks, break_costs

CASES = (("firstp", None), ("maxp", None), ("avgp", None), ("parade-max", None), ("keyb2", "bm25"), ("keyb2", "dense"))


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: numba compile, ONNX session, caches of the first call
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def preprocess(pipeline: Pipeline, query: str, docs: list[str], strategy: str, selector: str | None) -> int:
    """The gateway's work before the scorer: ``Pipeline.plan``, the code ``arank`` runs; returns the sequences built."""
    return len(pipeline.plan(query, docs, RerankOptions(strategy=strategy, selector=selector)).inputs)


def run(model_dir: Path, datasets: Path, n_docs: int, max_chars: int, repeats: int) -> dict:
    # The scorer is never called here: only the CPU stages are measured, cold (no document cache:
    # every repeat pays the full work; bench/cache.py measures documents seen before).
    pipeline = Pipeline.from_model_dir(get_settings().with_overrides(model_dir=model_dir, document_cache_bytes=0))
    query, docs = meeting_documents(datasets, n_docs, max_chars)
    raw = Tokenizer.from_file(str(model_dir / "gateway" / "tokenizer.json"))
    raw.no_truncation()
    raw.no_padding()
    n_tokens = sum(len(e.ids) for e in raw.encode_batch(docs, add_special_tokens=False))

    raw_s = _median_seconds(lambda: raw.encode_batch(docs, add_special_tokens=False), repeats)
    result = {
        "documents": len(docs),
        "document_tokens": n_tokens,
        "repeats": repeats,
        "raw_tokenizer_tokens_per_s": n_tokens / raw_s,
        "strategies": {},
    }
    for strategy, selector in CASES:
        # dense: the warm-up fills the block-embedding cache, so this is the repeated-document case.
        name = strategy + (f"/{selector}" if selector else "") + (" (cached)" if selector == "dense" else "")
        seconds = _median_seconds(lambda s=strategy, k=selector: preprocess(pipeline, query, docs, s, k), repeats)
        result["strategies"][name] = {
            "sequences": preprocess(pipeline, query, docs, strategy, selector),
            "tokens_per_s": n_tokens / seconds,
            "ratio_to_raw": raw_s / seconds,
            "ms": seconds * 1000,
        }

    # The segmentation DP alone: numba against the identical plain-Python function.
    doc = pipeline.tokenizer.encode_documents([docs[0]])[0]
    costs = break_costs(doc, pipeline.break_costs)
    numba_s = _median_seconds(lambda: cheapest_cut(costs, 63, 1.0), repeats)
    python_s = _median_seconds(lambda: cheapest_cut.py_func(costs, 63, 1.0), max(1, repeats // 2))
    assert np.array_equal(cheapest_cut(costs, 63, 1.0), cheapest_cut.py_func(costs, 63, 1.0))
    result["segmentation_dp"] = {
        "tokens": len(doc),
        "numba_ms": numba_s * 1000,
        "python_ms": python_s * 1000,
        "speedup": python_s / numba_s,
        "blocks": len(blocks(doc, pipeline.break_costs)),
    }
    return result


def print_table(result: dict) -> None:
    print(f"{result['documents']} QMSum val transcripts, {result['document_tokens']:,} document tokens, median of {result['repeats']} runs")
    print(f"raw tokenizers encode_batch: {result['raw_tokenizer_tokens_per_s']:,.0f} tokens/s")
    print(f"{'strategy':<22}{'tokens/s':>12}{'ms':>10}{'vs raw':>9}")
    for name, row in result["strategies"].items():
        print(f"{name:<22}{row['tokens_per_s']:>12,.0f}{row['ms']:>10.1f}{row['ratio_to_raw']:>9.2f}")
    dp = result["segmentation_dp"]
    print(
        f"segmentation DP on {dp['tokens']:,} tokens: numba {dp['numba_ms']:.2f} ms, "
        f"plain Python {dp['python_ms']:.1f} ms ({dp['speedup']:.0f}x)"
    )
