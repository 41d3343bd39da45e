"""Write ``triton-embedded-cuda/``: the embedded repository's GPU variant.

    out/triton-embedded-cuda/cross_encoder/config.pbtxt     python backend, device/dtype parameters
    out/triton-embedded-cuda/cross_encoder/1/model.py       modelserver/python_models/model_torch.py
    out/triton-embedded-cuda/cross_encoder/1/torch_encoder.py
    out/triton-embedded-cuda/cross_encoder/1/grouping.py    the request grouping shared with model.py
    out/triton-embedded-cuda/cross_encoder/1/encoder.json   head, token types, yes/no ids (from the manifest)
    out/triton-embedded-cuda/cross_encoder/1/checkpoint/    the Hugging Face weights in the serving dtype

Which repository when (docs/PERFORMANCE.md): the official Triton container with
``triton/`` (onnxruntime backend, TensorRT fp16) for production GPU nodes; this
one where the container cannot run (the nvidia-pytriton wheel's tritonserver on
a GPU machine, no containers); ``triton-embedded/`` (ONNX Runtime, CPU) without
a GPU. The hook in ``keyrank prepare --device cuda`` is one call after
``write_repositories``::

    if device == "cuda": write_gpu_repository(out, ce_entry, ce_dir, max_batch_size=max_batch_size)

and ``python -m keyrank.prepare.gpu_repository --out models --model <checkpoint>`` does the
same for an already prepared directory.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from keyrank.modelserver.repository import INPUTS, MODEL_NAME, PYTHON_MODELS
from keyrank.prepare.repositories import warmup_config, write_if_changed

REPOSITORY = "triton-embedded-cuda"
"""Folder of the GPU variant inside the prepared model directory."""


def gpu_config(*, hidden_size: int, num_labels: int, max_batch_size: int, max_length: int, device: str, dtype: str,
               cuda_graphs: bool, instances: int = 1) -> str:
    """config.pbtxt: the same tensors as the ONNX repositories; the model picks its device from ``device``
    (KIND_CPU instances: the Python stub runs on the host and drives the GPU through PyTorch)."""
    inputs = ",\n".join(f'  {{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }}' for n in INPUTS)
    preferred = sorted({max(1, max_batch_size // 4), max(1, max_batch_size // 2), max_batch_size})
    params = {"device": device, "dtype": dtype, "cuda_graphs": "true" if cuda_graphs else "false"}
    return "\n".join([
        f'name: "{MODEL_NAME}"',
        'backend: "python"',
        f"max_batch_size: {max_batch_size}",
        f"input [\n{inputs}\n]",
        (
            "output [\n"
            f'  {{ name: "logits" data_type: TYPE_FP32 dims: [ {num_labels} ] }},\n'
            f'  {{ name: "pooled" data_type: TYPE_FP32 dims: [ {hidden_size} ] }}\n]'
        ),
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]",
        # The batcher merges equal shapes only; a GPU wants big batches, so it may wait 0.5 ms for more.
        # One FIFO queue: no priority_levels (repositories.py, above triton_config: a 500 ms batcher wait).
        f"dynamic_batching {{\n  preferred_batch_size: [ {', '.join(map(str, preferred))} ]\n  max_queue_delay_microseconds: 500\n}}",
        # Every width is run once at load (zero tensors: the outputs are thrown away), so no request pays
        # for cuBLAS/SDPA kernel selection on a first shape.
        warmup_config(max_length),
        *(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()),
    ]) + "\n"


def write_gpu_repository(out: Path, ce: dict, checkpoint: Path, *, max_batch_size: int = 256, device: str = "cuda",
                         dtype: str = "bfloat16", cuda_graphs: bool = False, instances: int = 1) -> Path:
    """The GPU variant for the manifest entry ``ce`` of ``checkpoint``; returns the repository folder."""
    repository = Path(out) / REPOSITORY
    model_dir = repository / MODEL_NAME
    version = model_dir / "1"
    write_if_changed(model_dir / "config.pbtxt", gpu_config(
        hidden_size=ce["hidden_size"], num_labels=ce["num_labels"], max_batch_size=max_batch_size,
        max_length=ce["max_length"], device=device, dtype=dtype, cuda_graphs=cuda_graphs, instances=instances,
    ))
    write_if_changed(version / "model.py", (PYTHON_MODELS / "model_torch.py").read_text())
    write_if_changed(version / "torch_encoder.py", (PYTHON_MODELS / "torch_encoder.py").read_text())
    write_if_changed(version / "grouping.py", (PYTHON_MODELS / "grouping.py").read_text())
    template = ce.get("template", {})
    spec = {
        "source": ce.get("source"), "fingerprint": ce.get("fingerprint"), "head": ce["head"],
        "decoder": bool(template.get("yes_no")), "yes_no": template.get("yes_no"),
        "uses_token_type_ids": bool(ce.get("uses_token_type_ids", True)), "weights_dtype": dtype,
    }
    old = json.loads((version / "encoder.json").read_text()) if (version / "encoder.json").exists() else None
    if old != spec or not (version / "checkpoint" / "config.json").exists():
        _save_checkpoint(Path(checkpoint), version / "checkpoint", dtype, decoder=spec["decoder"])
    write_if_changed(version / "encoder.json", json.dumps(spec, indent=2) + "\n")
    return repository


def _save_checkpoint(source: Path, target: Path, dtype: str, *, decoder: bool) -> None:
    """The weights in the serving dtype (bf16 halves the size: it also travels to a GPU machine in one call), and the tokenizer."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    auto = AutoModelForCausalLM if decoder else AutoModelForSequenceClassification
    model = auto.from_pretrained(source, dtype={"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype])
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    # The tokenizer too: the folder then loads anywhere, e.g. as the do-it-yourself baseline of `keyrank bench --gpu`.
    AutoTokenizer.from_pretrained(source).save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keyrank.prepare.gpu_repository", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("models"), help="a directory `keyrank prepare` wrote")
    parser.add_argument("--model", type=Path, required=True, help="the checkpoint folder it was prepared from")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--cuda-graphs", action="store_true")
    parser.add_argument("--max-batch-size", type=int, default=256)
    args = parser.parse_args(argv)
    manifest = json.loads((args.out / "gateway" / "manifest.json").read_text())
    repository = write_gpu_repository(args.out, manifest["cross_encoder"], args.model, max_batch_size=args.max_batch_size,
                                      device=args.device, dtype=args.dtype, cuda_graphs=args.cuda_graphs)
    print(f"wrote {repository} ({args.device}, {args.dtype})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
