"""The systems `keyrank bench --peers` measures (bench/peers.py): keyrank itself and the libraries people
use on CPU, each a ``Peer`` that builds a scorer of (query, documents) groups from a model folder and the
checkpoint; and the worker process that runs a peer under another interpreter (``--peer-python``).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Groups = list[tuple[str, list[str]]]
"""(query, its documents) of one workload."""


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


def keyrank_local(model_dir: Path, checkpoint: Path, threads: int):
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


def _st_openvino_static_int8(model_dir: Path, checkpoint: Path, threads: int):
    """sentence-transformers' static int8 OpenVINO export (``export_static_quantized_openvino_model``: NNCF
    post-training quantization through optimum-intel, its default ``OVQuantizationConfig``), the last
    speed-up its "Speeding up inference" page offers on CPU. Its default calibration set, GLUE SST-2, is on
    the Hugging Face Hub; here it calibrates on the same number of texts (300) of QMSum *train* meetings
    (a query and a chunk of its meeting, as one text, as that function tokenizes), a local dataset folder."""
    import torch
    from sentence_transformers import CrossEncoder, export_static_quantized_openvino_model

    torch.set_num_threads(threads)
    path = _writable_checkpoint(checkpoint)
    calibration = path.parent / "calibration"
    calibration.mkdir()
    with open(calibration / "train.jsonl", "w", encoding="utf-8") as f:
        for text in _qmsum_train_texts(300):
            f.write(json.dumps({"sentence": text}) + "\n")
    kwargs = {"backend": "openvino", "model_kwargs": {"ov_config": {"INFERENCE_NUM_THREADS": threads}}}
    export_static_quantized_openvino_model(CrossEncoder(str(path), device="cpu", max_length=512, **kwargs), None, str(path),
                                           dataset_name=str(calibration), dataset_config_name="default",
                                           dataset_split="train", column_name="sentence")
    kwargs["model_kwargs"]["file_name"] = "openvino/openvino_model_qint8_quantized.xml"
    model = CrossEncoder(str(path), device="cpu", max_length=512, **kwargs)
    return lambda groups: [np.asarray(model.predict([(q, d) for d in docs], batch_size=32, show_progress_bar=False),
                                      np.float64).reshape(len(docs), -1)[:, -1] for q, docs in groups]


def _qmsum_train_texts(count: int, chars: int = 2000) -> list[str]:
    """``count`` texts of QMSum train meetings: a query of the meeting and a ``chars``-character chunk of it."""
    from keyrank.config import get_settings

    texts: list[str] = []
    for path in sorted((get_settings().eval_data_dir / "qmsum" / "train").glob("*.json")):
        meeting = json.loads(path.read_text())
        queries = [q["query"] for q in meeting.get("specific_query_list", [])]
        text = "\n".join(f"{t['speaker']}: {t['content']}" for t in meeting["meeting_transcripts"])
        for i, start in enumerate(range(0, len(text) - chars, 4 * chars)):
            if queries:
                texts.append(f"{queries[i % len(queries)]} {text[start:start + chars]}")
            if len(texts) == count:
                return texts
    return texts


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
    Peer("keyrank local (in-process)", None, "keyrank", keyrank_local, "keyrank-local"),
    Peer("keyrank, embedded Triton (gRPC hop)", None, "keyrank", _keyrank_triton, "keyrank-triton"),
    Peer(f"{ST}, PyTorch fp32 (default)", "sentence_transformers", "sentence-transformers", _sentence_transformers("torch"), "st-torch"),
    Peer(f"{ST}, PyTorch bf16", "sentence_transformers", "sentence-transformers", _sentence_transformers("torch", "bf16"), "st-torch-bf16"),
    Peer(f'{ST}, backend="openvino"', "optimum.intel", "sentence-transformers[openvino]", _sentence_transformers("openvino"), "st-openvino"),
    Peer(f'{ST}, backend="onnx"', "optimum.onnxruntime", "sentence-transformers[onnx]", _sentence_transformers("onnx"), "st-onnx"),
    Peer(f'{ST}, backend="onnx", O3 optimized export', "optimum.onnxruntime", "sentence-transformers[onnx]",
         _sentence_transformers("onnx", "O3"), "st-onnx-o3"),
    Peer(f'{ST}, backend="onnx", dynamic int8 export (avx512_vnni)', "optimum.onnxruntime", "sentence-transformers[onnx]",
         _sentence_transformers("onnx", "avx512_vnni"), "st-onnx-qint8"),
    Peer(f'{ST}, backend="openvino", static int8 export', "datasets", "sentence-transformers[openvino] datasets",
         _st_openvino_static_int8, "st-openvino-qint8"),
    Peer("fastembed TextCrossEncoder", "fastembed", "fastembed", _fastembed, "fastembed"),
    Peer("flashrank Ranker", "flashrank", "flashrank", _flashrank, "flashrank", probability=True),
)
"""The systems, keyrank in-process first (the reference of ratios and score agreement)."""
FP32_REFERENCE = "st-torch"
"""The system whose scores are fp32's: the checkpoint in PyTorch, as it was trained."""

_CLOSERS: list[Callable[[], None]] = []


def close_all() -> None:
    """Close what the systems built so far opened (rerankers, temporary folders, worker processes), newest first."""
    for close in reversed(_CLOSERS):
        close()
    _CLOSERS.clear()


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


def external(python: str, key: str, model_dir: Path, checkpoint: Path, threads: int):
    """The peer ``key`` built in a worker process of ``python`` (this module, ``worker``); its scorer sends
    the groups as one JSON line and reads the scores back (the pipe costs milliseconds against seconds)."""
    service = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [service, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([python, "-m", "keyrank.bench.peer_systems", key, str(model_dir), str(checkpoint), str(threads)],
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
    """``python -m keyrank.bench.peer_systems KEY MODEL_DIR CHECKPOINT THREADS``: builds one peer, then answers each
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
        close_all()
    return 0


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]))
