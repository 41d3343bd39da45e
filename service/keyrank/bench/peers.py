"""`keyrank bench --peers`: keyrank's CPU scoring side by side with the libraries people use on CPU, each
at its default and at the fastest configuration its own documentation offers.

Every system scores the same (query, document) pairs with the same checkpoint on the same number of
threads: short pairs (TREC DL20 BM25 passages, ~80 tokens) and long pairs (QMSum val chunks cut to
512 tokens). Rounds are interleaved (every system once per round, in turn, with a pause between systems
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

import fnmatch
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FLOP_PER_512_PAIR = 13.3e9
"""Forward FLOPs of one 512-token MiniLM-L6 pair (6 layers, hidden 384, FFN 1536, attention included)."""
AGREEMENT_MIN = 0.99
"""A system whose Spearman correlation with keyrank's scores is below this is flagged as another model."""

Groups = list[tuple[str, list[str]]]
"""(query, its documents) of one workload."""


SETTLE_S = 0.5
"""Pause between two systems in a round: PyTorch's OpenMP and ONNX Runtime's pools spin for a while
after a run, and would take the cores from the next system."""


@dataclass(frozen=True)
class Peer:
    """A system to measure: the module it needs (None = keyrank itself), how to build its scorer, and a
    short ``key`` (``--peer-python``, the worker process). ``probability``: the system returns
    sigmoid(logit) (flashrank), turned back into logits before comparing with fp32."""

    name: str
    module: str | None
    package: str
    make: Callable[[Path, Path, int], Callable[[Groups], list[np.ndarray]]]
    key: str = ""
    probability: bool = False


# --- the systems --------------------------------------------------------------------------


def _keyrank_local(model_dir: Path, checkpoint: Path, threads: int):
    from keyrank import Reranker

    reranker = Reranker.local(model_dir, threads=threads)
    return lambda groups: [_by_index(reranker.rank(q, docs, strategy="firstp"), len(docs)) for q, docs in groups]


def _keyrank_triton(model_dir: Path, checkpoint: Path, threads: int):
    from keyrank import Reranker

    os.environ["KEYRANK_EMBEDDED_ORT_THREADS"] = str(threads)
    reranker = Reranker.embedded(model_dir=model_dir, embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    _CLOSERS.append(reranker.close)
    return lambda groups: [_by_index(reranker.rank(q, docs, strategy="firstp"), len(docs)) for q, docs in groups]


def _by_index(ranking, n: int) -> np.ndarray:
    out = np.empty(n)
    for result in ranking.results:
        out[result.index] = result.score
    return out


def _sentence_transformers(backend: str, option: str = ""):
    """sentence-transformers' ``CrossEncoder`` as its documentation offers it on CPU ("Speeding up
    inference"): ``torch`` fp32 (the default) or bf16; ``openvino`` (optimum-intel: bfloat16 where the
    CPU has it, OpenVINO's own default); ``onnx`` (optimum-onnx) with the plain export, the O3 optimized
    export or the dynamic int8 one (``option`` ``O3`` / ``avx512_vnni``)."""
    def make(model_dir: Path, checkpoint: Path, threads: int):
        import torch
        from sentence_transformers import CrossEncoder

        torch.set_num_threads(threads)
        kwargs: dict = {}
        if backend == "torch":  # the checkpoint's config says fp16: ask for the precision explicitly
            kwargs["model_kwargs"] = {"dtype": torch.bfloat16 if option == "bf16" else torch.float32}
        elif backend == "openvino":
            kwargs = {"backend": "openvino", "model_kwargs": {"ov_config": {"INFERENCE_NUM_THREADS": threads}}}
        else:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            kwargs = {"backend": "onnx", "model_kwargs": {"session_options": options, "provider": "CPUExecutionProvider"}}
        path = checkpoint
        if option in ("O3", "avx512_vnni"):
            path = _writable_checkpoint(checkpoint)  # the export functions write beside the checkpoint
            from sentence_transformers import export_dynamic_quantized_onnx_model, export_optimized_onnx_model

            export = export_optimized_onnx_model if option == "O3" else export_dynamic_quantized_onnx_model
            export(CrossEncoder(str(path), device="cpu", max_length=512, **kwargs), option, str(path))
            kwargs["model_kwargs"]["file_name"] = f"onnx/model_{'O3' if option == 'O3' else 'qint8_avx512_vnni'}.onnx"
        model = CrossEncoder(str(path), device="cpu", max_length=512, **kwargs)
        return lambda groups: [np.asarray(model.predict([(q, d) for d in docs], batch_size=32, show_progress_bar=False),
                                          np.float64).reshape(len(docs), -1)[:, -1] for q, docs in groups]
    return make


def _writable_checkpoint(checkpoint: Path) -> Path:
    """A private copy of the checkpoint folder (hard links where possible), removed at the end of the run."""
    folder = Path(tempfile.mkdtemp(prefix="keyrank-peers-ckpt-")) / checkpoint.name
    _CLOSERS.append(lambda: shutil.rmtree(folder.parent, ignore_errors=True))
    shutil.copytree(checkpoint, folder, copy_function=_link_or_copy)
    return folder


def _link_or_copy(source, target):
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _model_folder(model_dir: Path, checkpoint: Path) -> Path:
    """The checkpoint's tokenizer files and keyrank's fp32 ONNX export in one folder (hard links), as the
    ONNX peers expect a model folder."""
    folder = Path(tempfile.mkdtemp(prefix="keyrank-peers-"))
    _CLOSERS.append(lambda: shutil.rmtree(folder, ignore_errors=True))
    for path in checkpoint.iterdir():
        if path.suffix in (".json", ".txt"):
            shutil.copy2(path, folder / path.name)
    (folder / "onnx").mkdir()
    for target in (folder / "model.onnx", folder / "onnx" / "model.onnx"):
        try:
            os.link(model_dir / "triton" / "cross_encoder" / "1" / "model.onnx", target)
        except OSError:
            shutil.copy2(model_dir / "triton" / "cross_encoder" / "1" / "model.onnx", target)
    return folder


def _fastembed(model_dir: Path, checkpoint: Path, threads: int):
    from fastembed.common.model_description import ModelSource
    from fastembed.rerank.cross_encoder import TextCrossEncoder

    folder = _model_folder(model_dir, checkpoint)
    name = f"keyrank/{checkpoint.name}"
    if name not in {m["model"] for m in TextCrossEncoder.list_supported_models()}:
        TextCrossEncoder.add_custom_model(name, model_file="onnx/model.onnx", sources=ModelSource(hf=name), size_in_gb=0.1)
    model = TextCrossEncoder(name, specific_model_path=str(folder), threads=threads)
    return lambda groups: [np.asarray(list(model.rerank(q, docs, batch_size=32)), np.float64) for q, docs in groups]


def _flashrank(model_dir: Path, checkpoint: Path, threads: int):
    from flashrank import Ranker, RerankRequest
    from flashrank.Config import model_file_map

    folder = _model_folder(model_dir, checkpoint)
    model_file_map.setdefault(folder.name, "model.onnx")  # flashrank's table of model files, extended with ours
    ranker = Ranker(model_name=folder.name, cache_dir=str(folder.parent), max_length=512)
    # flashrank makes its session with ONNX Runtime's defaults: all cores, which is `threads` on a box of that size

    def score(groups):
        out = []
        for q, docs in groups:
            answer = ranker.rerank(RerankRequest(query=q, passages=[{"id": i, "text": d} for i, d in enumerate(docs)]))
            scores = np.empty(len(docs))
            for row in answer:
                scores[row["id"]] = float(row["score"])
            out.append(scores)
        return out
    return score


ST = "sentence-transformers CrossEncoder"
PEERS: tuple[Peer, ...] = (
    Peer("keyrank local (in-process)", None, "keyrank", _keyrank_local, "keyrank-local"),
    Peer("keyrank, embedded Triton (gRPC hop)", None, "keyrank", _keyrank_triton, "keyrank-triton"),
    Peer(f"{ST}, PyTorch fp32 (default)", "sentence_transformers", "sentence-transformers", _sentence_transformers("torch"), "st-torch"),
    Peer(f"{ST}, PyTorch bf16", "sentence_transformers", "sentence-transformers", _sentence_transformers("torch", "bf16"), "st-torch-bf16"),
    Peer(f'{ST}, backend="openvino"', "optimum.intel", "sentence-transformers[openvino]", _sentence_transformers("openvino"), "st-openvino"),
    Peer(f'{ST}, backend="onnx"', "optimum.onnxruntime", "sentence-transformers[onnx]", _sentence_transformers("onnx"), "st-onnx"),
    Peer(f'{ST}, backend="onnx", O3 optimized export', "optimum.onnxruntime", "sentence-transformers[onnx]",
         _sentence_transformers("onnx", "O3"), "st-onnx-o3"),
    Peer(f'{ST}, backend="onnx", dynamic int8 export (avx512_vnni)', "optimum.onnxruntime", "sentence-transformers[onnx]",
         _sentence_transformers("onnx", "avx512_vnni"), "st-onnx-qint8"),
    Peer("fastembed TextCrossEncoder", "fastembed", "fastembed", _fastembed, "fastembed"),
    Peer("flashrank Ranker", "flashrank", "flashrank", _flashrank, "flashrank", probability=True),
)
"""The systems, keyrank in-process first (the reference of ratios and score agreement)."""
FP32_REFERENCE = "st-torch"
"""The system whose scores are fp32's: the checkpoint in PyTorch, as it was trained."""

_CLOSERS: list[Callable[[], None]] = []


def available(peers: Sequence[Peer], elsewhere: dict[str, str] | None = None) -> tuple[list[Peer], dict[str, str]]:
    """The peers whose module is installed (or that run under another interpreter, ``elsewhere``: key ->
    python), and for the others why not (what to install)."""
    ok, missing = [], {}
    for peer in peers:
        if peer.module is None or peer.key in (elsewhere or {}) or _installed(peer.module):
            ok.append(peer)
        else:
            missing[peer.name] = f"not installed (pip install {peer.package}, or the 'peers' extra)"
    return ok, missing


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # the parent package itself is missing
        return False


def select(patterns: Sequence[str], peers: Sequence[Peer] = PEERS) -> list[Peer]:
    """The peers whose key matches one of ``patterns`` (globs), keyrank in-process always first (the reference)."""
    chosen = [p for i, p in enumerate(peers) if i == 0 or any(fnmatch.fnmatch(p.key, pat) for pat in patterns)]
    if len(chosen) == 1 and not any(fnmatch.fnmatch(peers[0].key, pat) for pat in patterns):
        raise SystemExit(f"--systems {' '.join(patterns)}: no system matched; keys: {', '.join(p.key for p in peers)}")
    return chosen


def peer_pythons(specs: Sequence[str], peers: Sequence[Peer] = PEERS) -> dict[str, str]:
    """``KEY=PYTHON`` options (KEY a peer key or a glob of keys, e.g. ``st-onnx*``) as {key: python}."""
    out = {}
    for spec in specs:
        pattern, sep, python = spec.partition("=")
        matched = [p.key for p in peers if fnmatch.fnmatch(p.key, pattern)]
        if not sep or not python or not matched:
            raise SystemExit(f"--peer-python {spec!r}: KEY=PYTHON with KEY one of {', '.join(p.key for p in peers)} (globs allowed)")
        out.update(dict.fromkeys(matched, python))
    return out


# --- a peer in another interpreter ------------------------------------------------------------


def _external(python: str, key: str, model_dir: Path, checkpoint: Path, threads: int):
    """The peer ``key`` built in a worker process of ``python`` (this module, ``worker``); its scorer sends
    the groups as one JSON line and reads the scores back (the pipe costs milliseconds against seconds)."""
    service = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [service, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([python, "-m", "keyrank.bench.peers", key, str(model_dir), str(checkpoint), str(threads)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    _CLOSERS.append(lambda: (proc.stdin.close(), proc.wait(30)))
    ready = json.loads(proc.stdout.readline() or '{"error": "the worker exited"}')
    if "error" in ready:
        raise RuntimeError(ready["error"])

    def score(groups: Groups) -> list[np.ndarray]:
        proc.stdin.write(json.dumps(groups) + "\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline() or '{"error": "the worker exited"}')
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return [np.asarray(s, np.float64) for s in answer["scores"]]
    return score


def worker(argv: Sequence[str]) -> int:
    """``python -m keyrank.bench.peers KEY MODEL_DIR CHECKPOINT THREADS``: builds one peer, then answers each
    line of groups on stdin with a line of scores on stdout (the library's own output goes to stderr)."""
    key, model_dir, checkpoint, threads = argv
    out, sys.stdout = sys.stdout, sys.stderr
    try:
        peer = next(p for p in PEERS if p.key == key)
        score = peer.make(Path(model_dir), Path(checkpoint), int(threads))
        out.write(json.dumps({"ready": True}) + "\n")
    except Exception as exc:  # noqa: BLE001 -- reported to the parent as this peer's reason
        out.write(json.dumps({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}) + "\n")
        return 1
    out.flush()
    try:
        for line in sys.stdin:
            try:
                answer = {"scores": [s.tolist() for s in score([(q, docs) for q, docs in json.loads(line)])]}
            except Exception as exc:  # noqa: BLE001
                answer = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            out.write(json.dumps(answer) + "\n")
            out.flush()
    finally:
        for close in reversed(_CLOSERS):
            close()
    return 0


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
                  lambda _m, c, t, d=d: _keyrank_local(d, c, t), f"keyrank-local-{i + 2}") for i, d in enumerate(also)]
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
                    systems[peer.name] = _external(peer_python[peer.key], peer.key, model_dir, checkpoint, threads)
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
        for _ in range(rounds):
            for workload, groups in loads.items():
                for name, score in systems.items():
                    time.sleep(settle_s)
                    started = time.perf_counter()
                    scores[workload][name] = score(groups)
                    seconds[workload][name].append(time.perf_counter() - started)
        peak_after = matmul_peak(threads)
    finally:
        for close in reversed(_CLOSERS):
            close()
        _CLOSERS.clear()
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


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
