"""`keyrank bench --gpu`: the GPU figures of docs/PERFORMANCE.md in ONE run on ONE machine, printed as ratios.

CPU (always):
  - preprocessing ceiling: document tokens/s and queries/s of keyb2-bm25, keyb2-blocks-bm25
    (the default), maxp and firstp requests (100 candidates of ~2k tokens of QMSum) over all cores
    (one spawned process per core, as uvicorn workers; document cache off).
GPU (CUDA only; otherwise the line "GPU parts skipped: no CUDA device"):
  - bf16 matrix-multiply peak (8192^3, CUDA events) measured now;
  - the cross-encoder at 512 tokens at saturation (``torch_encoder``, the code the
    GPU Triton model runs): pairs/s, TFLOP/s from the model's FLOP count, % of peak;
    bf16, fp16, bf16 with CUDA graphs and fp16 through torch.compile, each with its largest logit difference
    from the fp32 CPU path (which equals the ONNX export, tests/test_gpu_variant.py);
    and the fp16 graph on ONNX Runtime's CUDA provider (onnxruntime-gpu, I/O binding;
    prepare/ort_cuda.py) where that onnxruntime is installed, else why not;
  - end to end through HTTP: keyb2-bm25, keyb2-blocks-bm25, maxp, firstp, p50/p99 at concurrency 1
    and queries/s at saturation; gateway = `keyrank serve --workers N` on the
    embedded GPU Triton (``triton-embedded-cuda``) when the nvidia-pytriton wheel
    is installed, else ``python -m keyrank.modelserver.gpu_gateway`` (model in-process);
    cold (cache off, candidates drawn from a pool) and keyb2 with every document
    seen before (cache on);
  - the do-it-yourself baseline (bench/diy.py) on the same requests, and the ratio;
  - ceilings side by side: CPU preprocessing q/s vs GPU scoring q/s per strategy (the 512-token
    pairs/s counted in tokens, so keyb2-blocks' short inputs are charged their length).

    keyrank bench --gpu --model-dir models --json runs/bench-gpu.json
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from keyrank.bench import http_load
from keyrank.bench.processes import worker_processes
from keyrank.bench.workloads import candidate_documents
from keyrank.config import get_settings
from keyrank.cores import thread_count, usable_cores
from keyrank.prepare.gpu_repository import REPOSITORY
from keyrank.prepare.ort_cuda import REPOSITORY as ORT_REPOSITORY
from keyrank.pipeline import Pipeline, RerankOptions
from keyrank.modelserver.repository import MODEL_NAME

SKIPPED = "GPU parts skipped: no CUDA device"
STRATEGIES = (("keyb2", "bm25"), ("keyb2-blocks", "bm25"), ("maxp", None), ("firstp", None))
TARGETS = "keyb2-bm25 p50 <= 25 ms, p99 <= 60 ms (c=1); encoder >= 45% of bf16 peak; q/s >= 80% of min(ceilings) and >= 5x DIY"


def cuda_device() -> str | None:
    """The CUDA device's name, or None (no torch, no CUDA)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def _name(strategy: str, selector: str | None) -> str:
    return strategy + (f"-{selector}" if selector else "")


# --- CPU -----------------------------------------------------------------------------------
def preprocessing_ceiling(model_dir: Path, query: str, docs: list[str], workers: int, requests: int, strategies=STRATEGIES) -> dict:
    pipeline = Pipeline.from_model_dir(get_settings().with_overrides(model_dir=model_dir, document_cache_bytes=0))
    tokens = sum(len(d) for d in pipeline.encode(query, docs)[1])
    rows = {}
    for strategy, selector in strategies:
        options = RerankOptions(strategy=strategy, selector=selector)
        inputs = pipeline.plan(query, docs, options).inputs
        seconds, _ = worker_processes(model_dir, query, docs, requests, workers, options)
        rows[_name(strategy, selector)] = {"qps": requests / seconds, "tokens_per_s": requests * tokens / seconds,
                                           "sequences_per_query": len(inputs), "input_tokens_per_query": sum(len(i) for i in inputs.ids)}
    return {"workers": workers, "tokens_per_query": tokens, "strategies": rows}


# --- GPU: kernels ------------------------------------------------------------------------------
def matmul_peak(n: int = 8192, iters: int = 10) -> float:
    """bf16 TFLOP/s of an n^3 matrix product (mean of ``iters`` after 3 warm-ups)."""
    import torch

    a, b = (torch.randn(n, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (start.elapsed_time(end) / 1000) / 1e12


def encoder_saturation(folder: Path, rows: np.ndarray, peak_tflops: float, seconds: float = 2.0, *, device: str = "cuda",
                       batches: tuple[int, ...] = (32, 64, 128, 256, 512), ort_version: Path | None = None) -> dict:
    """Pairs/s at 512 tokens per precision / CUDA graphs, best batch size; inputs and outputs cross the host as served.
    With ``ort_version`` (triton-embedded-cuda-ort/cross_encoder/1), ONNX Runtime's CUDA provider on its fp16 graph too
    (``ort-cuda-fp16``), or ``ort_cuda_skipped``: why not."""
    from keyrank.modelserver.python_models.torch_encoder import (
        TorchCrossEncoder,
        flops_per_sequence,
    )

    flops = flops_per_sequence(json.loads((folder / "checkpoint" / "config.json").read_text()), rows.shape[1])
    out = {"flops_per_pair": flops, "variants": {}}
    # The fp32 CPU path (equal to the ONNX export within 1e-4, tests/test_gpu_variant.py) is the reference.
    check = rows[:16]
    reference, _ = TorchCrossEncoder(folder, device="cpu", dtype="float32")(check, np.ones_like(check), np.zeros_like(check))
    for name, dtype, graphs, compiled in (("bf16", "bfloat16", False, False), ("fp16", "float16", False, False),
                                          ("bf16+graphs", "bfloat16", True, False), ("fp16+compile", "float16", False, True)):
        try:
            encoder = TorchCrossEncoder(folder, device=device, dtype=dtype, cuda_graphs=graphs, compiled=compiled)
            out["variants"][name] = _saturated(lambda ids: encoder(ids, np.ones_like(ids), np.zeros_like(ids))[0], rows,
                                               reference, flops, peak_tflops, seconds, batches)
            if name in ("bf16", "fp16+compile"):  # where its time goes, at its best batch size
                out["kernels_" + name] = kernel_split(encoder, np.resize(rows, (out["variants"][name]["batch"], rows.shape[1])))
        except Exception as exc:  # noqa: BLE001 -- one variant failing (a compiler missing there) must not cost the rest of the run
            if name == "bf16":
                raise
            out.setdefault("failed", {})[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
        encoder = None
    if ort_version is not None:
        row = ort_cuda_saturation(ort_version, rows, reference, flops, peak_tflops, seconds, batches)
        if "skipped" in row:
            out["ort_cuda_skipped"] = row["skipped"]
        else:
            out["variants"]["ort-cuda-fp16"] = row
    return out


KERNEL_KINDS = (("matmul", ("gemm", "cutlass", "xmma", "nvjet", "addmm", "aten::mm", "aten::bmm", "aten::linear")),
                ("attention", ("flash", "fmha", "attention", "scaled_dot_product", "efficient")),
                ("copy", ("memcpy", "copy_", "aten::to", "aten::copy")))
"""Kernel (or, on a CPU, operator) name fragments per kind; everything else is elementwise and normalization."""


def kernel_split(encoder, ids: np.ndarray) -> dict:
    """Where one batch's device time goes: the share of matmuls, attention, copies and the rest (layer norm,
    GELU, bias, softmax, casts), from PyTorch's profiler; CUDA kernels on a GPU, CPU operators on a CPU (tests).
    Says which stage bounds the encoder's share of the matmul peak."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = encoder.device.type == "cuda"
    masks = (np.ones_like(ids), np.zeros_like(ids))
    encoder(ids, *masks)  # warm: lazy inits out of the profile
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        encoder(ids, *masks)
        if cuda:
            torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if us <= 0:
            continue
        name = event.key.lower()
        kind = next((k for k, fragments in KERNEL_KINDS if any(f in name for f in fragments)), "other")
        times[kind] = times.get(kind, 0.0) + us
    total = sum(times.values()) or 1.0
    return {"device_ms": total / 1e3, "share": {k: times.get(k, 0.0) / total for k, _ in (*KERNEL_KINDS, ("other", ()))}}


def ort_cuda_saturation(version: Path, rows: np.ndarray, reference: np.ndarray, flops: float, peak_tflops: float,
                        seconds: float = 2.0, batches: tuple[int, ...] = (32, 64, 128, 256, 512)) -> dict:
    """The fp16 graph on ONNX Runtime's CUDA provider through I/O binding (``Reranker.local(device="cuda")``'s
    session, prepare/ort_cuda.py) like ``encoder_saturation``'s rows; or why it cannot run here."""
    from keyrank.scoring.local import cuda_scorer, run_bound, run_options

    scorer, why_not = cuda_scorer(version, pad_id=0)
    if scorer is None:
        return {"skipped": why_not}

    def run(ids: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        return run_bound(scorer.session, ["logits"], {k: v for k, v in feeds.items() if k in scorer.input_names}, "cuda",
                         run_options("cuda"))[0]

    return _saturated(run, rows, reference, flops, peak_tflops, seconds, batches)


def _saturated(run, rows: np.ndarray, reference: np.ndarray, flops: float, peak_tflops: float, seconds: float,
               batches: tuple[int, ...]) -> dict:
    """Pairs/s of ``run`` (token ids [N, 512] -> logits) at its best batch size, its share of the peak and its
    largest logit difference from ``reference`` (the fp32 CPU scores of ``rows[:16]``)."""
    logits = run(rows[: len(reference)])
    best = {"pairs_per_s": 0.0, "max_abs_diff_vs_fp32_cpu": float(np.abs(logits.reshape(reference.shape) - reference).max())}
    for batch in batches:
        ids = np.resize(rows, (batch, rows.shape[1]))
        for _ in range(3):
            run(ids)
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            run(ids)
            done += batch
        rate = done / (time.perf_counter() - t0)
        if rate > best["pairs_per_s"]:
            best.update(pairs_per_s=rate, batch=batch)
    best["tflops"] = best["pairs_per_s"] * flops / 1e12
    best["pct_of_peak"] = 100 * best["tflops"] / peak_tflops
    return best


# --- GPU: end to end ------------------------------------------------------------------------------
def end_to_end(model_dir: Path, queries, pool, *, candidates: int, requests: int, concurrency: int, duration_s: float, workers: int,
               log_dir: Path, device: str = "cuda", strategies=STRATEGIES, bodies_per_case: int = 50, out: dict | None = None,
               saved=lambda: None) -> dict:
    """HTTP figures per strategy, cold and (keyb2) with every document seen before. ``device`` cpu: the same
    path on a CPU (tests; the Triton model then needs KEYRANK_EMBEDDED_DEVICE=cpu). Rows go into ``out`` as
    they are measured, each followed by ``saved()`` and a printed line, so a run cut short keeps them."""
    env = {"KEYRANK_CAPACITY_SEQUENCES_PER_S": "100000", "KEYRANK_REQUEST_TIMEOUT_S": "120", "KEYRANK_TRITON_BATCH_SIZE": "64",
           "KEYRANK_TRITON_MAX_IN_FLIGHT": "32", "KEYRANK_MAX_BODY_BYTES": str(64 * 2**20)}
    triton, why = None, ""
    try:
        from keyrank.modelserver.embedded import EmbeddedTriton

        triton = EmbeddedTriton(model_dir / REPOSITORY, settings=get_settings().with_overrides(model_dir=model_dir, embedded_ready_timeout_s=600))
        triton.start().wait_ready(600)
    except Exception as exc:  # noqa: BLE001 -- no wheel, no stub for this Python, model failed: say so, use the in-process gateway
        if triton is not None:
            triton.stop()
        triton, why = None, f" (embedded Triton unavailable: {type(exc).__name__}: {str(exc)[:200]})"
    gateway = f"keyrank serve --workers {workers} on the embedded GPU Triton" if triton else f"python -m keyrank.modelserver.gpu_gateway (model in-process, 1 process){why}"
    out = out if out is not None else {}
    out.update(gateway=gateway, strategies={})
    saved()
    try:
        seen_before = tuple(c for c in strategies if c == ("keyb2", "bm25"))
        for cache, cases in (("0", strategies), (str(1 << 30), seen_before)):
            if not cases:
                continue
            port = http_load.free_port()
            command = (http_load.keyrank_serve(model_dir, port, triton.grpc_url, workers) if triton else http_load.torch_gateway(model_dir, port, device))
            with http_load.gateway(command, {**env, "KEYRANK_DOCUMENT_CACHE_BYTES": cache}, port, log_dir / f"gateway-cache{cache}.log") as url:
                for strategy, selector in cases:
                    warm = cache != "0"
                    # Cold: every request its own draw from the pool. Seen before: one draw, sent again and again.
                    bodies = http_load.bodies(queries, pool, strategy, selector, 1 if warm else bodies_per_case, candidates)
                    row = {"latency": http_load.latency(url, bodies, requests), "saturation": http_load.saturation(url, bodies, concurrency, duration_s)}
                    name = _name(strategy, selector) + (" (seen before)" if warm else "")
                    out["strategies"][name] = row
                    saved()
                    print(f"  measured {name}: c=1 p50 {row['latency']['p50_ms']:.1f} ms, c={concurrency} {row['saturation']['qps']:.1f} q/s",
                          flush=True)
    finally:
        if triton is not None:
            triton.stop()
    return out


def run(model_dir: Path, datasets: Path, *, requests: int = 100, workers: int = 0, candidates: int = 100, concurrency: int = 64,
        duration_s: float = 15.0, cpu_requests: int = 0, strategies=STRATEGIES, encoder_only: bool = False,
        save=lambda result: None) -> dict:
    """Everything above; ``encoder_only``: the CPU ceiling, the peak and the cross-encoder's rows only (a short
    GPU run, e.g. ONNX Runtime's CUDA provider against PyTorch). ``save(result)`` runs after every stage (and
    every HTTP row): on a machine held for minutes, what was measured is written before anything later can fail."""
    workers = workers or thread_count()
    tokenizer = Pipeline.from_model_dir(get_settings().with_overrides(model_dir=model_dir, document_cache_bytes=0)).tokenizer
    pool, queries = candidate_documents(datasets, tokenizer, 2 * candidates)  # cold requests draw from twice their size
    device = cuda_device()
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": usable_cores(), "gpu": device},
        "cpu": preprocessing_ceiling(model_dir, queries[0], pool[:candidates], workers, cpu_requests or 2 * workers, strategies),
    }
    save(result)
    if device is None:
        result["skipped"] = SKIPPED
        return result
    folder = model_dir / REPOSITORY / MODEL_NAME / "1"
    if not (folder / "encoder.json").exists():
        raise SystemExit(f"{folder} missing: python -m keyrank.prepare.gpu_repository --out {model_dir} --model <checkpoint>")
    pipeline = Pipeline.from_model_dir(get_settings().with_overrides(model_dir=model_dir))
    rows = np.stack([ids for ids in pipeline.plan(queries[0], pool[:20], RerankOptions(strategy="maxp")).inputs.ids if len(ids) == 512][:64])
    peak = matmul_peak()
    ort_version = model_dir / ORT_REPOSITORY / MODEL_NAME / "1"
    result["gpu"] = {"bf16_peak_tflops": peak, "encoder_512": encoder_saturation(folder, rows, peak, ort_version=ort_version)}
    best = max(v["pairs_per_s"] for v in result["gpu"]["encoder_512"]["variants"].values())
    # The GPU's rate at 512 tokens, counted in tokens: keyb2-blocks' short inputs are not whole sequences.
    result["ceilings_qps"] = {
        name: {"cpu_preprocessing": row["qps"], "gpu_scoring": best * rows.shape[1] / row["input_tokens_per_query"]}
        for name, row in result["cpu"]["strategies"].items()
    }
    save(result)
    if encoder_only:
        return result
    result["gpu"]["http"] = {}
    with tempfile.TemporaryDirectory() as logs:
        end_to_end(model_dir, queries, pool, candidates=candidates, requests=requests, concurrency=concurrency, duration_s=duration_s,
                   workers=workers, log_dir=Path(logs), out=result["gpu"]["http"], saved=lambda: save(result))
    from keyrank.bench import diy

    rng = np.random.default_rng(1)
    same = [(queries[i % len(queries)], [pool[j] for j in rng.choice(len(pool), size=candidates, replace=False)]) for i in range(10)]
    result["gpu"]["diy_maxp"] = diy.measure(folder / "checkpoint", "cuda", same)
    save(result)
    return result


def print_table(result: dict) -> None:
    m = result["machine"]
    print(f"machine: {m['cpu']}, {m['cores']:g} cores, GPU: {m['gpu'] or 'none'}")
    cpu = result["cpu"]
    print(f"CPU preprocessing ceiling, {cpu['workers']} processes, {cpu['tokens_per_query']:,} document tokens per query (cache off):")
    for name, row in cpu["strategies"].items():
        print(f"  {name:<12}{row['tokens_per_s']:>12,.0f} tokens/s{row['qps']:>8.2f} q/s  ({row['sequences_per_query']} sequences/query)")
    if "skipped" in result:
        print(result["skipped"])
        return
    g = result["gpu"]
    print(f"bf16 matmul peak: {g['bf16_peak_tflops']:.0f} TFLOP/s")
    enc = g["encoder_512"]
    print(f"cross-encoder at 512 tokens ({enc['flops_per_pair'] / 1e9:.1f} GFLOP/pair):")
    for name, row in enc["variants"].items():
        print(f"  {name:<12}{row['pairs_per_s']:>10,.0f} pairs/s (batch {row['batch']}){row['tflops']:>8.1f} TFLOP/s{row['pct_of_peak']:>6.1f}% of peak"
              f"   max |logit - fp32 CPU| {row['max_abs_diff_vs_fp32_cpu']:.3f}")
    for name in ("bf16", "fp16+compile"):
        if "kernels_" + name in enc:
            split = enc["kernels_" + name]
            print(f"  {name} device time per batch {split['device_ms']:.1f} ms: "
                  + ", ".join(f"{kind} {100 * share:.0f}%" for kind, share in split["share"].items()))
    for name, why in enc.get("failed", {}).items():
        print(f"  {name}: failed: {why}")
    if "ort_cuda_skipped" in enc:
        print(f"  ort-cuda-fp16: {enc['ort_cuda_skipped']}")
    if "http" not in g:  # --encoder-only
        for name, row in result["ceilings_qps"].items():
            print(f"  ceiling {name:<12} CPU {row['cpu_preprocessing']:>8.1f} q/s  GPU {row['gpu_scoring']:>8.1f} q/s")
        return
    http = g["http"]
    print(f"end to end through HTTP ({http['gateway']}):")
    for name, row in http["strategies"].items():
        lat, sat = row["latency"], row["saturation"]
        print(f"  {name:<24} c=1 p50 {lat['p50_ms']:>7.1f} ms  p99 {lat['p99_ms']:>7.1f} ms   c={sat['concurrency']} {sat['qps']:>7.1f} q/s")
    diy = g["diy_maxp"]
    print(f"do-it-yourself CrossEncoder fp16 MaxP: p50 {diy['p50_ms']:.0f} ms, {diy['qps']:.2f} q/s")
    for name in ("keyb2-bm25", "keyb2-blocks-bm25", "maxp"):
        if name in http["strategies"]:
            print(f"  keyrank {name} at saturation / DIY: {http['strategies'][name]['saturation']['qps'] / diy['qps']:.1f}x")
    print("ceilings (q/s): CPU preprocessing vs GPU scoring")
    for name, row in result["ceilings_qps"].items():
        sat = http["strategies"].get(name, {}).get("saturation", {}).get("qps")
        share = f", sustained {sat:.1f} = {100 * sat / min(row.values()):.0f}% of the lower" if sat else ""
        print(f"  {name:<12} CPU {row['cpu_preprocessing']:>8.1f}  GPU {row['gpu_scoring']:>8.1f}{share}")
    print(f"targets: {TARGETS}")
