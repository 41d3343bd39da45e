"""`keyrank bench --peers`: keyrank's CPU scoring side by side with the libraries people use on CPU, each
at its default and at the fastest configuration its own documentation offers.

Every system scores the same (query, document) pairs with the same checkpoint on the same number of
threads: short pairs (TREC DL20 BM25 passages, ~80 tokens) and long pairs (QMSum val chunks cut to
512 tokens). Rounds are interleaved (every system once per round, in turn, the order reversed every
other round, with a pause between systems
so the previous one's spinning threads are idle), the median round is reported as pairs/s with the
ratio to keyrank in-process and to the fastest peer, and the long pairs also as a share of the same
run's matrix-multiply peak (13.3 GFLOP per 512-token MiniLM-L6 pair). Each system's scores are
compared with the fp32 reference's (sentence-transformers on PyTorch fp32: the checkpoint as it is):
the largest absolute difference, and the Spearman correlation with keyrank's scores, which flags a
peer that scores another model.

Peers come from the ``peers`` extra (``pip install -e '.[peers]'``); those not installed, or that fail
to load the model, are listed with the reason instead of a row. A peer whose library cannot share an
environment with the others (sentence-transformers' ONNX backend needs optimum-onnx, which pins an
older transformers) runs in a worker process of another interpreter: ``--peer-python KEY=PYTHON``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from keyrank.bench.peer_systems import FP32_REFERENCE, PEERS, Groups, Peer, available, close_all, external, keyrank_local

FLOP_PER_512_PAIR = 13.3e9
"""Forward FLOPs of one 512-token MiniLM-L6 pair (6 layers, hidden 384, FFN 1536, attention included)."""
AGREEMENT_MIN = 0.99
"""A system whose Spearman correlation with keyrank's scores is below this is flagged as another model."""

SETTLE_S = 0.5
"""Pause between two systems in a round: PyTorch's OpenMP and ONNX Runtime's pools spin for a while
after a run, and would take the cores from the next system."""


def round_order(names: Sequence[str], round_index: int) -> list[str]:
    """The systems of one round: in turn, reversed every other round (A B C, C B A, ...). A system's place
    in the round moves its time by a few percent on a shared 2-core VM (the same OpenVINO model measured
    twice in one round, always in the same order: 1.04x between the two), so no system keeps the better place."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


# --- workloads and the peak -----------------------------------------------------------------


def workloads(datasets: Path, tokenizer, short_queries: int = 8, short_docs: int = 20, long_pairs: int = 48) -> dict[str, Groups]:
    """Short: DL20 BM25 passages; long: QMSum val chunks cut to 512 model tokens next to their query."""
    from keyrank.bench.workloads import candidate_documents, dl20_requests

    short = [(q, docs[:short_docs]) for q, docs in dl20_requests(datasets, short_queries)]
    chunks, queries = candidate_documents(datasets, tokenizer, long_pairs, tokens=520)
    per_query = 6
    long = [(queries[i // per_query], chunks[i:i + per_query]) for i in range(0, len(chunks), per_query)]
    return {"short (DL20 passages)": short, "512 tokens (QMSum chunks)": long}


def matmul_peak(threads: int, repeats: int = 5, n: int = 1024) -> dict[str, float]:
    """FLOP/s of one [n, n] x [n, n] MatMul in ONNX Runtime on ``threads`` threads: fp32 and int8
    (MatMulInteger, u8 x s8), the median of ``repeats``."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from keyrank.scoring.local import session_options

    out = {}
    rng = np.random.default_rng(0)
    for kind, op, a_type, b_type in (("fp32", "MatMul", TensorProto.FLOAT, TensorProto.FLOAT),
                                     ("int8", "MatMulInteger", TensorProto.UINT8, TensorProto.INT8)):
        graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["c"])], kind,
                                  [helper.make_tensor_value_info("a", a_type, [n, n]), helper.make_tensor_value_info("b", b_type, [n, n])],
                                  [helper.make_tensor_value_info("c", TensorProto.FLOAT if kind == "fp32" else TensorProto.INT32, [n, n])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        session = ort.InferenceSession(model.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])
        if kind == "fp32":
            feeds = {"a": rng.standard_normal((n, n), np.float32), "b": rng.standard_normal((n, n), np.float32)}
        else:
            feeds = {"a": rng.integers(0, 255, (n, n), dtype=np.uint8), "b": rng.integers(-127, 127, (n, n), dtype=np.int8)}
        session.run(None, feeds)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            session.run(None, feeds)
            times.append(time.perf_counter() - started)
        out[kind] = 2 * n**3 / statistics.median(times)
    bf16 = _bf16_matmul_peak(threads, repeats, n)
    if bf16:
        out["bf16"] = bf16
    return out


def _bf16_matmul_peak(threads: int, repeats: int, n: int) -> float | None:
    """FLOP/s of the same MatMul on OpenVINO's CPU plugin in bfloat16 (what the openvino-bf16 variant
    computes in); None without OpenVINO or a bf16 CPU."""
    from keyrank.scoring import openvino

    if not openvino.bf16_supported():
        return None
    import openvino as ov

    rng = np.random.default_rng(0)
    a = ov.opset13.parameter([n, n], ov.Type.f32, name="a")
    weights = ov.opset13.constant(rng.standard_normal((n, n), np.float32))  # as in the encoder: weights are constants
    model = ov.Model([ov.opset13.matmul(a, weights, False, False)], [a], "bf16_peak")
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": threads,
                                                      "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    feeds = {"a": rng.standard_normal((n, n), np.float32)}
    request.infer(feeds)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        request.infer(feeds)
        times.append(time.perf_counter() - started)
    return 2 * n**3 / statistics.median(times)


# --- arithmetic (pinned by tests/test_peers.py) ------------------------------------------------


def summarize(seconds: dict[str, list[float]], pairs: int, reference: str, peak_flops: float | None,
              flop_per_pair: float | None) -> dict[str, dict]:
    """Per system: median seconds of its rounds, pairs/s from it, ratio to ``reference``'s pairs/s, and
    (when a FLOP count is given) effective FLOP/s and the share of ``peak_flops``."""
    rows = {}
    for name, times in seconds.items():
        median = statistics.median(times)
        rows[name] = {"median_s": median, "pairs_per_s": pairs / median, "rounds": len(times)}
    base = rows[reference]["pairs_per_s"]
    for row in rows.values():
        row["ratio"] = row["pairs_per_s"] / base
        if flop_per_pair is not None and peak_flops:
            row["gflop_per_s"] = row["pairs_per_s"] * flop_per_pair / 1e9
            row["share_of_peak"] = row["pairs_per_s"] * flop_per_pair / peak_flops
    return rows


def against_peers(rows: dict[str, dict], bf16_peak: float | None) -> None:
    """Adds to each row its pairs/s over the fastest peer's (keyrank's rows are not peers) and, on the
    512-token workload with a bf16 peak measured, the share of that peak (13.3 GFLOP per pair)."""
    fastest = max((row["pairs_per_s"] for name, row in rows.items() if not name.startswith("keyrank")), default=None)
    for row in rows.values():
        if fastest:
            row["vs_fastest_peer"] = row["pairs_per_s"] / fastest
        if bf16_peak:
            row["share_of_bf16_peak"] = row["pairs_per_s"] * FLOP_PER_512_PAIR / bf16_peak


def fp32_difference(fp32: list[np.ndarray], other: list[np.ndarray], probability: bool = False) -> float:
    """The largest |score - fp32 score| over all pairs, in logits (a system that returns probabilities,
    sigmoid(logit), is mapped back first: its own float32 rounding of the sigmoid stays in the figure)."""
    if probability:
        other = [np.log(np.clip(s, 1e-12, 1 - 1e-12)) - np.log1p(-np.clip(s, 1e-12, 1 - 1e-12)) for s in other]
    return float(max(np.max(np.abs(np.asarray(a) - np.asarray(b))) for a, b in zip(fp32, other)))


def agreement(reference: list[np.ndarray], other: list[np.ndarray]) -> float:
    """Spearman rank correlation of two systems' scores over all pairs of a workload."""
    from scipy.stats import spearmanr

    return float(spearmanr(np.concatenate(reference), np.concatenate(other)).statistic)


# --- the run --------------------------------------------------------------------------------


def run(model_dir: Path, datasets: Path, checkpoint: Path, *, threads: int = 2, rounds: int = 3,
        long_pairs: int = 48, peers: Sequence[Peer] = PEERS, peer_python: dict[str, str] | None = None,
        settle_s: float = SETTLE_S, also: Sequence[Path] = ()) -> dict:
    """``also``: more prepared folders whose CPU variant is measured in-process beside ``model_dir``'s
    (e.g. openvino-bf16 and openvino-int8 in the same rounds)."""
    from keyrank.config import Settings
    from keyrank.pipeline import Pipeline
    from keyrank.prepare.variants import served_variant

    from keyrank.prepare.variants import served_variant as _variant

    extra = [Peer(f"keyrank local (in-process), {_variant(d).split(' ')[0]}", None, "keyrank",
                  lambda _m, c, t, d=d: keyrank_local(d, c, t), f"keyrank-local-{i + 2}") for i, d in enumerate(also)]
    peers = [peers[0], *extra, *peers[1:]]
    tokenizer = Pipeline.from_model_dir(Settings(model_dir=model_dir)).tokenizer
    loads = workloads(datasets, tokenizer, long_pairs=long_pairs)
    peer_python = peer_python or {}
    ok, missing = available(peers, peer_python)
    systems: dict[str, Callable[[Groups], list[np.ndarray]]] = {}
    try:
        for peer in ok:
            try:
                if peer.key in peer_python:
                    systems[peer.name] = external(peer_python[peer.key], peer.key, model_dir, checkpoint, threads)
                else:
                    systems[peer.name] = peer.make(model_dir, checkpoint, threads)
                for groups in loads.values():
                    systems[peer.name](groups[:1])  # warm-up (first shapes, lazy loads)
            except Exception as exc:  # a peer that cannot load this model is reported, not fatal
                systems.pop(peer.name, None)
                missing[peer.name] = f"failed to load: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        reference = peers[0].name
        if reference not in systems:
            raise SystemExit(f"{reference} could not run: {missing.get(reference)}")
        seconds = {w: {name: [] for name in systems} for w in loads}
        scores: dict[str, dict[str, list[np.ndarray]]] = {w: {} for w in loads}
        peak = matmul_peak(threads)
        for r in range(rounds):
            for workload, groups in loads.items():
                for name in round_order(list(systems), r):
                    score = systems[name]
                    time.sleep(settle_s)
                    started = time.perf_counter()
                    scores[workload][name] = score(groups)
                    seconds[workload][name].append(time.perf_counter() - started)
        peak_after = matmul_peak(threads)
    finally:
        close_all()
    peak = {k: max(peak[k], peak_after.get(k, 0.0)) for k in peak}  # the better of before and after the rounds
    by_name = {p.name: p for p in peers}
    fp32 = next((p.name for p in peers if p.key == FP32_REFERENCE and p.name in systems), None)
    result: dict = {"threads": threads, "rounds": rounds, "fp32_reference": fp32, "peer_python": peer_python, "matmul_peak_gflop_per_s": {k: v / 1e9 for k, v in peak.items()},
                    "missing": missing, "load_average": os.getloadavg(), "keyrank_cpu_variant": served_variant(model_dir),
                    "workloads": {}}
    for workload, groups in loads.items():
        pairs = sum(len(docs) for _, docs in groups)
        long = workload.startswith("512")
        rows = summarize(seconds[workload], pairs, reference, peak["fp32"] if long else None, FLOP_PER_512_PAIR if long else None)
        against_peers(rows, peak.get("bf16") if long else None)
        for name, row in rows.items():
            row["spearman_vs_keyrank"] = agreement(scores[workload][reference], scores[workload][name])
            row["agrees"] = row["spearman_vs_keyrank"] >= AGREEMENT_MIN
            if fp32:
                row["max_abs_diff_vs_fp32"] = fp32_difference(scores[workload][fp32], scores[workload][name], by_name[name].probability)
        result["workloads"][workload] = {"pairs": pairs, "queries": len(groups), "systems": rows}
    return result


def print_table(result: dict) -> None:
    peak = result["matmul_peak_gflop_per_s"]
    bf16 = f", bf16 {peak['bf16']:.0f} GFLOP/s (OpenVINO)" if "bf16" in peak else ""
    print(f"threads {result['threads']}, {result['rounds']} interleaved rounds (median), load average "
          f"{', '.join(f'{x:.1f}' for x in result['load_average'])}; MatMul peak (ONNX Runtime, 1024^3): "
          f"fp32 {peak['fp32']:.0f} GFLOP/s, int8 {peak['int8']:.0f} GOP/s{bf16}; keyrank's CPU variant: "
          f"{result.get('keyrank_cpu_variant', 'unknown')}")
    for workload, data in result["workloads"].items():
        print(f"\n{workload}: {data['pairs']} pairs, {data['queries']} queries")
        print("| system | pairs/s | vs keyrank local | vs fastest peer | share of fp32 peak | share of bf16 peak | max abs diff vs fp32 | Spearman vs keyrank |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, row in data["systems"].items():
            share = f"{row['share_of_peak']:.0%}" if "share_of_peak" in row else "-"
            share16 = f"{row['share_of_bf16_peak']:.0%}" if "share_of_bf16_peak" in row else "-"
            fastest = f"{row['vs_fastest_peer']:.2f}x" if "vs_fastest_peer" in row else "-"
            flag = "" if row["agrees"] else " **reorders: another model, or lossy arithmetic**"
            diff = f"{row['max_abs_diff_vs_fp32']:.2g}" if "max_abs_diff_vs_fp32" in row else "-"
            print(f"| {name} | {row['pairs_per_s']:.1f} | {row['ratio']:.2f}x | {fastest} | {share} | {share16} | {diff} | "
                  f"{row['spearman_vs_keyrank']:.4f}{flag} |")
    for name, why in result["missing"].items():
        print(f"not measured: {name}: {why}")
    if result.get("fp32_reference"):
        print(f"fp32 reference: {result['fp32_reference']}")
    for key, python in (result.get("peer_python") or {}).items():
        print(f"{key} ran in a worker process of {python}")

