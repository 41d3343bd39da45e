"""What computes a served model's scores: the runtime and the precision it runs in, as GET /v1/models and
GET /tei/info and the ``keyrank_model_info`` metric report them (per model; TEI's ``model_dtype`` is the
default model's precision).

Found where it is decided, never assumed:

- a scorer in the gateway's process (``Reranker.local`` / ``Reranker.torch``) says what it opened;
- the embedded Triton (``keyrank serve``, ``Reranker.embedded``; ``triton_server_id`` set) serves the
  repository `keyrank prepare` wrote on this machine: on CPU its ``runtime.json`` (OpenVINO, in bfloat16
  where this CPU computes it, as the model reads it; ONNX Runtime where it says nothing or OpenVINO is not
  installed) and the manifest's CPU variant (int8 graphs); on CUDA the PyTorch variant's dtype
  (``KEYRANK_EMBEDDED_DTYPE`` over the weights') or the fp16 graph on ONNX Runtime;
- an external Triton is asked for the model's config: its backend (``onnxruntime``; ``python`` = the CPU
  image serving the embedded repository, read as above from the prepared folder the gateway shares), its
  instance kind (GPU or CPU) and a TensorRT accelerator's precision. A Triton that does not answer is
  ``unknown``, not guessed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from keyrank.api.routes import served_names
from keyrank.config import Settings
from keyrank.metrics import MODEL_INFO

PRECISIONS = {"bf16": "bfloat16", "f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16"}
"""OpenVINO's and ONNX's short names -> the names TEI's ``model_dtype`` and PyTorch use."""
INT8_VARIANTS = frozenset({"int8", "int8-selective", "openvino-int8"})
"""CPU variants (prepare/variants.py) whose graph computes its matrix multiplies in int8."""


@dataclass(frozen=True)
class Served:
    """What scores one served model."""

    runtime: str
    """``openvino``, ``onnxruntime``, ``torch``, ``tensorrt`` (ONNX Runtime's TensorRT accelerator) or ``unknown``."""
    precision: str
    """What the model computes in: ``bfloat16``, ``float16``, ``float32``, ``int8`` or ``unknown``."""
    device: str
    """``cpu``, ``cuda`` or ``unknown``."""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


UNKNOWN = Served("unknown", "unknown", "unknown")


def _cpu_variant(settings: Settings) -> str | None:
    """The CPU variant `keyrank prepare` chose for this model (its manifest), None when it recorded none."""
    try:
        manifest = json.loads((settings.gateway_dir / "manifest.json").read_text())
        return (manifest["cross_encoder"].get("cpu") or {}).get("variant")
    except (OSError, KeyError, ValueError):
        return None


def _prepared_model(settings: Settings) -> str:
    """The cross-encoder's folder in the model's prepared repository: ``triton_model``, except where KEYRANK_MODELS
    serves several (its ``triton_model`` is then the served name, and each folder's own is the one `keyrank
    prepare` writes, ``cross_encoder``, the setting's default: modelserver/repository.py's ``served_models``)."""
    return Settings.model_fields["triton_model"].default if settings.models else settings.triton_model


def embedded_cpu(settings: Settings) -> Served:
    """The CPU model of the embedded repository, as its ``model.py`` opens it on this machine."""
    from keyrank.scoring import openvino

    version = settings.embedded_repository("cpu") / _prepared_model(settings) / "1"
    asked = openvino.read_runtime(version)
    int8 = _cpu_variant(settings) in INT8_VARIANTS
    if asked.get("runtime") == "openvino" and openvino.available():
        precision = "int8" if int8 else PRECISIONS[openvino.precision_here(asked.get("precision", "f32"))]
        return Served("openvino", precision, "cpu")
    # ONNX Runtime: the fp32 export, a fused or int8 graph of it (or OpenVINO's model when OpenVINO is missing).
    return Served("onnxruntime", "int8" if int8 else "float32", "cpu")


def embedded_cuda(settings: Settings) -> Served:
    """The GPU variant of the embedded repository (``embedded_cuda_runtime``)."""
    if settings.embedded_cuda_runtime == "onnxruntime":
        return Served("onnxruntime", "float16", "cuda")
    version = settings.embedded_repository("cuda", "torch") / _prepared_model(settings) / "1"
    try:
        weights = json.loads((version / "encoder.json").read_text()).get("weights_dtype", "bfloat16")
    except (OSError, ValueError):
        weights = "bfloat16"
    # python_models/model_torch.py: the environment's KEYRANK_EMBEDDED_DTYPE over the dtype prepared.
    return Served("torch", os.environ.get("KEYRANK_EMBEDDED_DTYPE") or weights, "cuda")


def in_process(scorer: Any, settings: Settings) -> Served | None:
    """A scorer in the gateway's process: what it opened. None for a model server's client."""
    runtime = getattr(scorer, "runtime", None)
    if isinstance(runtime, dict):  # scoring/local.py's LocalScorer: ONNX Runtime (CPU or CUDA) or OpenVINO
        if runtime.get("provider") == "CUDAExecutionProvider":
            return Served("onnxruntime", "float16", "cuda")  # the fp16 graph of `keyrank prepare --device cuda`
        int8 = _cpu_variant(settings) in INT8_VARIANTS
        if runtime.get("runtime") == "openvino":
            return Served("openvino", "int8" if int8 else PRECISIONS.get(runtime.get("precision", "f32"), "float32"), "cpu")
        return Served("onnxruntime", "int8" if int8 else "float32", "cpu")
    encoder = getattr(scorer, "encoder", None)
    if encoder is not None and hasattr(encoder, "dtype"):  # scoring/pytorch.py's TorchScorer
        return Served("torch", str(encoder.dtype).removeprefix("torch."), str(getattr(encoder, "device", "cuda")).split(":")[0])
    return None


def from_triton_config(config: dict, settings: Settings) -> Served:
    """An external Triton's model config (``get_model_config``, as JSON) read as what it runs."""
    backend = config.get("backend") or config.get("platform", "")
    if backend == "python":  # the CPU image (docker/triton-cpu) serving the embedded repository
        return embedded_cpu(settings)
    if not backend.startswith("onnxruntime"):
        return Served(backend or "unknown", "unknown", "unknown")
    kinds = {group.get("kind", "KIND_GPU") for group in config.get("instance_group") or [{}]}
    device = "cuda" if "KIND_GPU" in kinds else "cpu"
    accelerators = ((config.get("optimization") or {}).get("execution_accelerators") or {}).get("gpu_execution_accelerator") or []
    for accelerator in accelerators:
        if accelerator.get("name") == "tensorrt":
            mode = (accelerator.get("parameters") or {}).get("precision_mode", "FP32")
            return Served("tensorrt", PRECISIONS.get(mode.lower(), mode.lower()), device)
    return Served("onnxruntime", "float32", device)


_asked: dict[tuple[str, str], Served] = {}
"""External Tritons' answers, by (url, model): a model's config does not change while it is loaded."""


async def external(settings: Settings) -> Served:
    """Ask the external Triton at ``triton_url`` what runs ``triton_model`` (``UNKNOWN`` if it does not say)."""
    key = (str(settings.triton_url), settings.triton_model)
    if key in _asked:
        return _asked[key]
    import tritonclient.grpc.aio as triton_aio

    client = triton_aio.InferenceServerClient(str(settings.triton_url))
    try:
        answer = await client.get_model_config(settings.triton_model, as_json=True,
                                               client_timeout=settings.triton_connect_timeout_s)
    except Exception:  # noqa: BLE001 -- down, slow, the config API restricted: not known, said as such
        return UNKNOWN
    finally:
        await client.close()
    _asked[key] = served = from_triton_config(answer.get("config", answer), settings)
    return served


async def served(reranker: Any) -> Served:
    """What scores ``reranker``'s model (a ``Reranker``)."""
    settings: Settings = reranker.settings
    found = in_process(reranker.scorer, settings)
    if found is not None:
        return found
    if settings.triton_server_id is not None:  # keyrank serve's or Reranker.embedded()'s own Triton
        return embedded_cuda(settings) if settings.embedded_device == "cuda" else embedded_cpu(settings)
    if settings.triton_url:
        return await external(settings)
    return UNKNOWN


async def served_models(app: Any) -> dict[str, Served]:
    """Every served model's name (as answers report it, the default first) -> what scores it; the
    ``keyrank_model_info`` metric is set to the same (at startup, and again whenever a route asks or, while a
    model server has not answered, /metrics is scraped: it is reported once it does)."""
    rerankers = app.state.rerankers or {name: app.state.reranker for name in served_names(app)}
    found = {name: await served(reranker) for name, reranker in rerankers.items()}
    if found:
        app.state.served = found
        MODEL_INFO.clear()
        for name, what in found.items():
            MODEL_INFO.labels(model=name).info(what.as_dict())
    return found
