"""Write ``triton-embedded-cuda-ort/``: the cross-encoder for ONNX Runtime's CUDA execution provider
(the ``onnxruntime-gpu`` wheel), in fp16.

    out/triton-embedded-cuda-ort/cross_encoder/config.pbtxt     python backend, as triton-embedded/
    out/triton-embedded-cuda-ort/cross_encoder/1/model.onnx     the fp32 export converted to fp16
    out/triton-embedded-cuda-ort/cross_encoder/1/runtime.json   {"runtime": "onnxruntime", "device": "cuda", "precision": "fp16"}
    out/triton-embedded-cuda-ort/cross_encoder/1/model.py       modelserver/python_models/model.py (the CPU model's code)
    out/triton-embedded-cuda-ort/cross_encoder/1/grouping.py

The conversion is ONNX Runtime's own (``onnxruntime.transformers.float16``): every weight and operation in
fp16 except the graph's inputs and outputs, which keep their types (int64 ids in, fp32 logits and pooled
vectors out), so the gateway cannot tell this model from the others. Its largest logit difference from
the fp32 export, on real pairs run on the CPU, is written to the manifest and must stay under
``FP16_ATOL``. Both CPU paths' session code reads ``runtime.json``: ``Reranker.local(device="cuda")``
(scoring/local.py) and the embedded Triton (``KEYRANK_EMBEDDED_DEVICE=cuda``,
``KEYRANK_EMBEDDED_CUDA_RUNTIME=onnxruntime``) run it on the CUDA provider with I/O binding, and say so
when this onnxruntime has no CUDA provider (the ``onnxruntime`` wheel, or no GPU).

    python -m keyrank.prepare.ort_cuda --out models     # for an already prepared directory
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np

from keyrank.modelserver.repository import MODEL_NAME, PYTHON_MODELS
from keyrank.prepare.repositories import triton_config, write_if_changed

log = logging.getLogger(__name__)

REPOSITORY = "triton-embedded-cuda-ort"
"""Folder of this variant inside the prepared model directory."""
RUNTIME = {"runtime": "onnxruntime", "device": "cuda", "precision": "fp16"}
FP16_ATOL = 0.05
"""Largest accepted logit difference from fp32 (the fp16 graph of ce-minilm-l6 differs by about 2e-3)."""


def fp16_graph(source: Path, target: Path) -> None:
    """The fp32 ONNX graph ``source`` in fp16 (inputs and outputs keep their types), written to ``target``."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    tmp = target.with_name(target.name + ".tmp")
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(tmp))
    tmp.replace(target)


def largest_difference(fp32: Path, fp16: Path, rows: np.ndarray) -> float:
    """Largest |logit| difference between the two graphs on ``rows`` (token ids, [N, L]), both on the CPU."""
    from keyrank.scoring.local import open_session

    answers = []
    for path in (fp32, fp16):
        session, names, _ = open_session(path)
        feeds = {"input_ids": rows, "attention_mask": np.ones_like(rows), "token_type_ids": np.zeros_like(rows)}
        answers.append(session.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0])
    return float(np.abs(answers[0] - answers[1]).max())


def write_ort_cuda_repository(out: Path, ce: dict, rows: np.ndarray, *, max_batch_size: int = 256, instances: int = 1) -> dict:
    """The repository for the manifest entry ``ce`` of the export under ``out``; returns what was checked
    (``{"max_abs_diff_vs_fp32": ...}``). ``rows``: real token ids to compare the graphs on."""
    fp32 = Path(out) / "triton" / MODEL_NAME / "1" / "model.onnx"
    model_dir = Path(out) / REPOSITORY / MODEL_NAME
    version = model_dir / "1"
    fp16 = version / "model.onnx"
    fresh = not fp16.exists() or fp16.stat().st_mtime < fp32.stat().st_mtime
    if fresh:
        fp16_graph(fp32, fp16)
    diff = largest_difference(fp32, fp16, rows)
    if diff > FP16_ATOL:
        fp16.unlink()
        raise ValueError(f"the fp16 graph differs from fp32 by {diff:.3g} (> {FP16_ATOL}): not served")
    write_if_changed(model_dir / "config.pbtxt", triton_config(
        backend="python", hidden_size=ce["hidden_size"], num_labels=ce["num_labels"], max_batch_size=max_batch_size,
        max_length=ce["max_length"], instances=instances))
    for name in ("model.py", "grouping.py"):
        write_if_changed(version / name, (PYTHON_MODELS / name).read_text())
    write_if_changed(version / "runtime.json", json.dumps(RUNTIME) + "\n")
    log.info("ONNX Runtime CUDA variant: fp16, max|fp16-fp32| %.2e on %d pairs%s", diff, len(rows), "" if fresh else " (graph up to date)")
    return {**RUNTIME, "max_abs_diff_vs_fp32": diff, "pairs": int(len(rows))}


def sample_rows(out: Path, datasets: Path | None, count: int = 16, length: int = 256) -> np.ndarray:
    """Token ids of real query-document pairs (the first QMSum train meeting, framed as the gateway frames them)
    or, without the data sets, of the tokenizer's own vocabulary in a fixed draw."""
    from keyrank.config import get_settings
    from keyrank.pipeline import Pipeline, RerankOptions

    pipeline = Pipeline.from_model_dir(get_settings().with_overrides(model_dir=Path(out), document_cache_bytes=0))
    meetings = sorted((Path(datasets) / "qmsum" / "train").glob("*.json")) if datasets else []
    if meetings:
        meeting = json.loads(meetings[0].read_text())
        text = "\n".join(f"{t['speaker']}: {t['content']}" for t in meeting["meeting_transcripts"])
        query = meeting["specific_query_list"][0]["query"]
        ids = pipeline.plan(query, [text], RerankOptions(strategy="maxp")).inputs.ids
        rows = [np.asarray(r[:length]) for r in ids if len(r) >= length][:count]
        if rows:
            return np.stack(rows).astype(np.int64)
    rng = np.random.default_rng(0)
    return rng.integers(1000, pipeline.tokenizer.vocab_size, (count, length)).astype(np.int64)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keyrank.prepare.ort_cuda", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("models"), help="a directory `keyrank prepare` wrote")
    parser.add_argument("--datasets", type=Path, default=Path("../shared/datasets"), help="real pairs to compare fp16 with fp32 on")
    parser.add_argument("--max-batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    manifest_path = args.out / "gateway" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    rows = sample_rows(args.out, args.datasets)
    entry = write_ort_cuda_repository(args.out, manifest["cross_encoder"], rows, max_batch_size=args.max_batch_size)
    manifest["cross_encoder"]["ort_cuda"] = entry
    write_if_changed(manifest_path, json.dumps(manifest, indent=2) + "\n")
    print(f"{args.out / REPOSITORY}: fp16, max|fp16-fp32| {entry['max_abs_diff_vs_fp32']:.2e} on {entry['pairs']} pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
