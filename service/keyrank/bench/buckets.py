"""`keyrank bench --buckets`: fixed length buckets against widths chosen per request, in one run.

For firstp, keyb2/bm25 and maxp on real requests (DL20 passages: short;
SQuAD contexts: medium; QMSum 2k-token candidates: long) it counts the tokens
sent to the model, padding included, under the fixed list and under each
adaptive rule (at most K widths, multiples of M), and times the cross-encoder
on them with ONNX Runtime on this CPU (the same ``model.onnx`` Triton serves;
median of repeats, fixed and adaptive interleaved so load drift hits both).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from keyrank.bench.workloads import candidate_documents, dl20_requests, squad_requests
from keyrank.config import get_settings
from keyrank.pipeline import Pipeline, RerankOptions
from keyrank.scoring import ModelInputs, bucket_batches
from keyrank.scoring.buckets import choose_edges, padded_tokens

RULES = ((2, 32), (3, 32), (4, 32), (4, 16), (6, 32))
"""Adaptive rules measured: (most widths per request, width multiple)."""
STRATEGIES = (("firstp", None), ("keyb2", "bm25"), ("maxp", None))


def requests(datasets: Path, pipeline: Pipeline, n_requests: int, n_long: int) -> dict[str, list[tuple[str, list[str]]]]:
    """The three request sets: DL20 (100 short passages), SQuAD (one article's contexts), QMSum (2k-token candidates)."""
    docs, queries = candidate_documents(datasets, pipeline.tokenizer, n_requests * n_long)
    qmsum = [(queries[i % len(queries)], docs[i * n_long : (i + 1) * n_long]) for i in range(n_requests)]
    return {"dl20": dl20_requests(datasets, n_requests), "squad": squad_requests(datasets, n_requests), "qmsum": qmsum}


def _lengths(inputs: ModelInputs) -> np.ndarray:
    return np.fromiter((len(i) for i in inputs.ids), dtype=np.int64, count=len(inputs))


def padding_table(pipeline: Pipeline, sets: dict, fixed: list[int]) -> list[dict]:
    """Per data set and strategy: real tokens, tokens sent (fixed, each rule) and the widths used."""
    rows = []
    for name, reqs in sets.items():
        for strategy, selector in STRATEGIES:
            plans = [pipeline.plan(q, d, RerankOptions(strategy=strategy, selector=selector)).inputs for q, d in reqs]
            lengths = [_lengths(p) for p in plans]
            row = {
                "set": name, "strategy": strategy + (f"/{selector}" if selector else ""),
                "sequences": int(sum(x.size for x in lengths)), "real_tokens": int(sum(x.sum() for x in lengths)),
                "fixed": sum(padded_tokens(x, np.asarray(fixed)) for x in lengths),
                "fixed_shapes": max(len(np.unique(np.searchsorted(fixed, x))) for x in lengths),
            }
            for k, m in RULES:
                edges = [choose_edges(x, fixed, max_shapes=k, multiple=m) for x in lengths]
                row[f"K{k}/M{m}"] = sum(padded_tokens(x, e) for x, e in zip(lengths, edges))
            rows.append(row)
    return rows


def onnx_times(pipeline: Pipeline, onnx_path: Path, sets: dict, fixed: list[int], rule: tuple[int, int], repeats: int, max_sequences: int) -> list[dict]:
    """Median ONNX Runtime seconds per request set (first ``max_sequences`` sequences), fixed vs ``rule``;
    only where the rule changes the shapes (elsewhere both send the very same tensors)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    pad = pipeline.template.pad_id

    def run(inputs: ModelInputs, **shapes) -> float:
        t0 = time.perf_counter()
        for batch in bucket_batches(inputs, buckets=fixed, batch_size=32, pad_id=pad, **shapes):
            session.run(["logits"], {k: v for k, v in batch.feeds().items() if k in names})
        return time.perf_counter() - t0

    rows = []
    for name, reqs in sets.items():
        seen: set[tuple[int, ...]] = set()
        for strategy, selector in STRATEGIES:
            merged = ModelInputs([], [])
            for q, d in reqs:
                merged = merged + pipeline.plan(q, d, RerankOptions(strategy=strategy, selector=selector)).inputs
            lengths = tuple(_lengths(merged).tolist())
            edges = choose_edges(np.asarray(lengths), fixed, max_shapes=rule[0], multiple=rule[1])
            if lengths in seen or padded_tokens(np.asarray(lengths), edges) == padded_tokens(np.asarray(lengths), np.asarray(fixed)):
                continue  # the same sequences as a strategy timed already, or the same shapes either way
            seen.add(lengths)
            # Requests keep their own widths: score request by request, as the gateway does.
            chunks = [ModelInputs(merged.ids[i : i + 100], merged.types[i : i + 100]) for i in range(0, min(len(merged), max_sequences), 100)]
            run(chunks[0])  # warm-up
            fixed_s, adaptive_s = [], []
            for _ in range(repeats):
                fixed_s.append(sum(run(c) for c in chunks))
                adaptive_s.append(sum(run(c, max_shapes=rule[0], multiple=rule[1]) for c in chunks))
            rows.append({
                "set": name, "strategy": strategy + (f"/{selector}" if selector else ""),
                "sequences": sum(len(c) for c in chunks),
                "fixed_ms": statistics.median(fixed_s) * 1000, "adaptive_ms": statistics.median(adaptive_s) * 1000,
            })
    return rows


def run(model_dir: Path, datasets: Path, *, n_requests: int = 5, n_long: int = 100, repeats: int = 3,
        max_sequences: int = 200, rule: tuple[int, int] = (4, 32)) -> dict:
    pipeline = Pipeline.from_model_dir(get_settings().with_overrides(model_dir=model_dir, document_cache_bytes=0))
    fixed = list(get_settings().length_buckets)
    sets = requests(datasets, pipeline, n_requests, n_long)
    result = {"fixed_buckets": fixed, "rules": [f"K{k}/M{m}" for k, m in RULES], "padding": padding_table(pipeline, sets, fixed)}
    if repeats > 0:
        onnx = model_dir / "triton" / "cross_encoder" / "1" / "model.onnx"
        result["onnx_rule"] = f"K{rule[0]}/M{rule[1]}"
        result["onnx"] = onnx_times(pipeline, onnx, sets, fixed, rule, repeats, max_sequences)
    return result


def print_table(result: dict) -> None:
    print(f"tokens sent to the model, padding included (fixed = {result['fixed_buckets']}; KK/MM = at most K widths, multiples of M)")
    rules = result["rules"]
    print(f"{'set':<7}{'strategy':<12}{'seqs':>6}{'real':>10}{'fixed':>10}" + "".join(f"{r:>10}" for r in rules))
    for row in result["padding"]:
        print(f"{row['set']:<7}{row['strategy']:<12}{row['sequences']:>6}{row['real_tokens']:>10,}{row['fixed']:>10,}"
              + "".join(f"{row[r]:>10,}" for r in rules))
    if "onnx" in result:
        print(f"ONNX Runtime on this CPU, median ms over the first sequences of each set: fixed vs {result['onnx_rule']}")
        for row in result["onnx"]:
            print(f"{row['set']:<7}{row['strategy']:<12}{row['sequences']:>6}{row['fixed_ms']:>10.0f}{row['adaptive_ms']:>10.0f}"
                  f"{row['fixed_ms'] / row['adaptive_ms']:>8.2f}x")
