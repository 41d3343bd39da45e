"""The two Triton model repositories `keyrank prepare` writes for the cross-encoder.

``triton/`` is for the official Triton container (native onnxruntime backend,
GPU, optional TensorRT fp16); ``triton-embedded/`` is for the ``tritonserver``
binary of the nvidia-pytriton wheel (Python backend running the same
``model.onnx`` with ONNX Runtime on CPU). Both declare the same tensors, so the
gateway cannot tell them apart. The model's name, its tensors and the Python-backend
code copied beside it are the model server's (``keyrank.modelserver.repository``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from keyrank.modelserver.repository import INPUTS, MODEL_NAME, PYTHON_MODELS


def warmup_lengths(max_length: int) -> tuple[int, ...]:
    """Every width the gateway can send to a model that reads ``max_length`` tokens (its length buckets; when
    widths are chosen per request, every multiple of KEYRANK_LENGTH_BUCKET_MULTIPLE; for a long-context model,
    longp's long widths up to KEYRANK_LONGP_MAX_LENGTH): each is run once at load, so no request pays a
    first-shape cost. Read from the same settings as the gateway's, at prepare time."""
    from keyrank.config import get_settings
    from keyrank.scoring.buckets import possible_widths

    s = get_settings()
    return possible_widths(s.length_buckets, max_shapes=s.length_bucket_shapes, multiple=s.length_bucket_multiple,
                           max_length=s.longest_input(max_length))


def warmup_config(max_length: int, inputs: tuple[str, ...] = INPUTS) -> str:
    """``model_warmup``: one zero batch of each width in ``warmup_lengths``."""
    entries = []
    for length in warmup_lengths(max_length):
        tensors = " ".join(
            f'inputs {{ key: "{n}" value: {{ data_type: TYPE_INT64 dims: [ {length} ] zero_data: true }} }}' for n in inputs
        )
        entries.append(f'  {{ name: "warmup_{length}" batch_size: 1 {tensors} }}')
    return "model_warmup [\n" + ",\n".join(entries) + "\n]"


# No priority levels: the dynamic batcher of every config written here (and gpu_repository.py's) has one
# FIFO queue. With ``priority_levels`` Triton's batcher cannot prefetch a batch while the model instance
# is busy: it waits until the instance is idle again, and the wake-up of an execution that ends can come
# before the instance counts as idle, so a request that arrived meanwhile waited for the batcher's 500 ms
# timeout (a small inference took ~520 ms instead of ~20 ms; docs/RELIABILITY.md, "The batcher's 500 ms
# wait"). The gateway orders batches itself, cheapest request first (scoring/fairness.py); the priority
# it still sends is ignored by a model without levels. The embedded Triton drops the levels from a folder
# prepared before (modelserver/repository.py, ``stage``).


def triton_config(
    *, backend: str, hidden_size: int, num_labels: int, max_batch_size: int, max_length: int,
    instances: int = 1, tensorrt_fp16: bool = False, name: str = MODEL_NAME, inputs: tuple[str, ...] = INPUTS,
) -> str:
    """config.pbtxt of the cross-encoder (or of an interaction graph: ``name``, its four ``inputs``, ``hidden_size``
    its feature width): dims exclude the batch axis, so clients send [N, L]."""
    gpu = backend == "onnxruntime"
    names, inputs = inputs, ",\n".join(f'  {{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }}' for n in inputs)
    preferred = sorted({max(1, max_batch_size // 4), max(1, max_batch_size // 2), max_batch_size})
    lines = [
        f'name: "{name}"',
        f'backend: "{backend}"',
        f"max_batch_size: {max_batch_size}",
        f"input [\n{inputs}\n]",
        "output [\n"
        f'  {{ name: "logits" data_type: TYPE_FP32 dims: [ {num_labels} ] }},\n'
        f'  {{ name: "pooled" data_type: TYPE_FP32 dims: [ {hidden_size} ] }}\n]',
        f"instance_group [ {{ count: {instances} kind: {'KIND_GPU' if gpu else 'KIND_CPU'} }} ]",
        # The batcher only merges equal shapes; the gateway pads to length buckets so they are.
        # One FIFO queue: no priority_levels (see above).
        "dynamic_batching {\n"
        f"  preferred_batch_size: [ {', '.join(map(str, preferred))} ]\n"
        f"  max_queue_delay_microseconds: {500 if gpu else 2000}\n"
        "}",
        warmup_config(max_length, names),
    ]
    if gpu and tensorrt_fp16:
        full = ",".join(f"{n}:{max_batch_size}x{max_length}" for n in names)
        opt = ",".join(f"{n}:{max(1, max_batch_size // 2)}x{min(256, max_length)}" for n in names)
        low = ",".join(f"{n}:1x1" for n in names)
        params = {
            "precision_mode": "FP16", "max_workspace_size_bytes": str(1 << 30),
            "trt_engine_cache_enable": "1", "trt_engine_cache_path": "/tmp/keyrank_trt_cache",
            "trt_profile_min_shapes": low, "trt_profile_opt_shapes": opt, "trt_profile_max_shapes": full,
        }
        body = "\n".join(f'      parameters {{ key: "{k}" value: "{v}" }}' for k, v in params.items())
        lines.append(
            "optimization { execution_accelerators {\n  gpu_execution_accelerator : [ {\n"
            f'      name : "tensorrt"\n{body}\n  }} ]\n}}}}'
        )
    if not gpu:  # read by modelserver/python_models/model.py; 0 = the CPUs divided among the instances
        lines.append('parameters { key: "intra_op_thread_count" value: { string_value: "0" } }')
    return "\n".join(lines) + "\n"


def write_repositories(out: Path, ce: dict, tensorrt_fp16: bool, max_batch_size: int, instances: int,
                       cpu_model: Path | None = None) -> None:
    """Configs and model.py of both repositories; the embedded one serves ``cpu_model`` (the CPU variant
    `keyrank prepare` chose and gated), else the production model.onnx."""
    from keyrank.config import get_settings

    # The longest input any strategy sends (longp's, capped by KEYRANK_LONGP_MAX_LENGTH), not the model's own
    # limit: TensorRT's profile and the warm-up stop there.
    longest = get_settings().longest_input(ce["max_length"])
    shape = {"hidden_size": ce["hidden_size"], "num_labels": ce["num_labels"],
             "max_batch_size": max_batch_size, "max_length": longest}
    production = out / "triton" / MODEL_NAME
    write_if_changed(production / "config.pbtxt", triton_config(backend="onnxruntime", tensorrt_fp16=tensorrt_fp16, **shape))
    embedded = out / "triton-embedded" / MODEL_NAME
    write_if_changed(embedded / "config.pbtxt", triton_config(backend="python", instances=instances, **shape))
    version = embedded / "1"
    for name in ("model.py", "grouping.py"):  # the model and the request grouping it shares with the GPU variant
        write_if_changed(version / name, (PYTHON_MODELS / name).read_text())
    # Which runtime runs model.onnx (model.py and Reranker.local read it): the one the CPU variant was gated on.
    runtime = (ce.get("cpu") or {}).get("runtime") or {"runtime": "onnxruntime"}
    write_if_changed(version / "runtime.json", json.dumps(runtime) + "\n")
    source, target = cpu_model or production / "1" / "model.onnx", version / "model.onnx"
    if not _same_file(source, target):
        tmp = target.with_suffix(".onnx.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(source, tmp)  # same bytes, no second 90 MB copy
        except OSError:
            shutil.copy2(source, tmp)
        os.replace(tmp, target)


def write_if_changed(path: Path, text: str) -> None:
    """Write only if changed, via rename: an up-to-date tree is left untouched (and hard links intact)."""
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _same_file(source: Path, target: Path) -> bool:
    """A hard link, or a copy made after the source was last written."""
    if not target.exists():
        return False
    if os.path.samefile(source, target):
        return True
    a, b = source.stat(), target.stat()
    return a.st_size == b.st_size and b.st_mtime >= a.st_mtime
