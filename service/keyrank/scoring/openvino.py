"""The cross-encoder on OpenVINO's CPU plugin: the runtime of the ``openvino`` and ``openvino-bf16`` CPU
variants (`keyrank prepare --cpu-variant`, docs/PERFORMANCE.md section 7).

OpenVINO reads the fp32 ONNX export as it is and runs its matrix multiplies in bfloat16 on CPUs that
have it (AVX512_BF16, AMX): 2x ONNX Runtime's fp32 on 512-token pairs on this project's AMD EPYC, with
rankings that pass the quality gate. Where the CPU lacks bf16 it computes in fp32 (said in the log).

Which runtime serves a prepared model is written beside its ``model.onnx`` (``runtime.json``,
``RUNTIME_FILE``); the embedded Triton model (``python_models/model.py``) reads the same file and repeats
the few lines below, since it imports nothing from keyrank.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import numpy as np

from keyrank.cores import thread_count

log = logging.getLogger(__name__)

RUNTIME_FILE = "runtime.json"
"""Beside a served model.onnx: ``{"runtime": "openvino", "precision": "bf16"}``; absent = ONNX Runtime."""
ONNXRUNTIME = {"runtime": "onnxruntime"}


def read_runtime(version_dir: Path) -> dict:
    """The runtime a prepared version folder asks for (ONNX Runtime when it says nothing)."""
    path = Path(version_dir) / RUNTIME_FILE
    return json.loads(path.read_text()) if path.is_file() else dict(ONNXRUNTIME)


def available() -> bool:
    """OpenVINO is installed (the ``embedded`` and ``export`` extras bring it)."""
    import importlib.util

    return importlib.util.find_spec("openvino") is not None


@functools.cache
def core():
    """This process's one ``openvino.Core``, shared by every session (its methods are thread-safe). A Core per
    session loaded and released the CPU plugin each time a session was built and dropped."""
    import openvino as ov

    return ov.Core()


def bf16_supported() -> bool:
    """This CPU computes bfloat16 natively (OpenVINO's CPU plugin lists BF16 among its capabilities)."""
    if not available():
        return False
    return "BF16" in core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def precision_here(precision: str) -> str:
    """``bf16`` where this CPU has it, else ``f32`` (OpenVINO's hint would fall back silently)."""
    return "bf16" if precision == "bf16" and bf16_supported() else "f32"


class OpenVinoSession:
    """A compiled model and one infer request: ``run`` has ONNX Runtime's ``session.run`` signature.

    One run at a time (the in-process scorer holds a lock around its runs); latency hint, one stream,
    ``threads`` cores (0 = this process's usable cores)."""

    def __init__(self, path: str | Path, *, precision: str = "bf16", threads: int = 0) -> None:
        self.path = Path(path)
        self.precision = precision_here(precision)
        """What the CPU plugin computes in: ``bf16`` or ``f32``."""
        if self.precision != precision:
            log.warning("this CPU has no bfloat16: %s runs in f32 (same scores as fp32, ~half the speed)", self.path)
        self.compiled = core().compile_model(core().read_model(str(self.path)), "CPU", {
            "INFERENCE_PRECISION_HINT": self.precision,
            "INFERENCE_NUM_THREADS": threads or thread_count(),
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1,
        })
        self.request = self.compiled.create_infer_request()
        self.input_names: tuple[str, ...] = tuple(port.get_any_name() for port in self.compiled.inputs)

    def run(self, output_names: list[str], feeds: dict[str, np.ndarray], run_options=None) -> list[np.ndarray]:
        self.request.infer({k: v for k, v in feeds.items() if k in self.input_names})
        return [self.request.get_tensor(name).data.copy() for name in output_names]
