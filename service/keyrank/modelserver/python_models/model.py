"""Triton Python-backend model of the embedded server: runs the cross-encoder's
``model.onnx`` (next to this file) on CPU with ONNX Runtime, or with OpenVINO when
``runtime.json`` beside it says so (the ``openvino``/``openvino-bf16`` CPU variants), or on
ONNX Runtime's CUDA provider when it says ``"device": "cuda"`` (triton-embedded-cuda-ort/).

Copied into ``models/triton-embedded/cross_encoder/1/`` by `keyrank prepare`;
it runs inside Triton's Python stub, so it imports nothing from keyrank.
The dynamic batcher's requests are grouped by shape (``grouping.py``, shared
with the GPU variant); each group runs through ONNX Runtime as one batch.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnxruntime as ort

# Nothing may be written beside the model (a read-only volume is the norm): the stub runs Python
# isolated, so PYTHONDONTWRITEBYTECODE never reaches it, and the helpers below would be compiled into
# a __pycache__ here. (This file itself is imported before it can say so: the embedded Triton serves
# it through links in its private work dir, where that bytecode lands.)
sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))  # grouping.py lies beside this file
from grouping import execute_grouped

THREADS_ENV = "KEYRANK_EMBEDDED_ORT_THREADS"
"""Overrides the config's ``intra_op_thread_count`` parameter."""
CORES_ENV = "KEYRANK_USABLE_CORES"
"""The cores this server may use, where they are fewer than its CPU affinity says (a container's CPU limit):
keyrank sets it for the embedded Triton it starts (keyrank/cores.py, where the count comes from)."""
RUN_TOKENS_ENV = "KEYRANK_EMBEDDED_RUN_TOKENS"
"""Overrides ``RUN_TOKENS`` (``OPENVINO_RUN_TOKENS`` on OpenVINO); 0 = one run per batch, however big."""
RUN_TOKENS = 4096
"""Tokens (rows x width) of one ONNX Runtime run: a bigger batch runs in slices of at most this many
(8 x 512, 32 x 128), so the stub's peak memory does not grow with what the dynamic batcher merged
(docs/RELIABILITY.md, "Memory of the model process")."""
OPENVINO_RUN_TOKENS = 512
"""Tokens of one OpenVINO run: a batch runs in slices of one 512-token row (per-row cost is flat at 512 tokens,
46.7 ms for [1, 512] and 47.2 ms a row for [8, 512] in bf16 on 2 cores; 512-token slices were never slower
than whole batches at widths 64-512), and stops between slices once all its requests were cancelled."""
FAILURES_BEFORE_EXIT = 3
"""Failed runs in a row (cancellations aside) after which this model process exits: a runtime that fails
every run is broken, and Triton would keep the model "ready" while every request gets an error. The
supervisor (keyrank/modelserver/supervision.py) sees the process die, unloads the model (``/readyz`` 503) and
loads it again, once."""
FAULT_FILE_ENV = "KEYRANK_EMBEDDED_FAULT_FILE"
"""Fault injection for the tests: while the file this names exists, every run fails as a broken runtime's would."""


class TritonPythonModel:
    """One instance per ``instance_group`` count; each owns an ONNX Runtime session."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.output_names = [tensor["name"] for tensor in config["output"]]
        # The same options as the in-process scorer's (keyrank/scoring/local.py, session_options;
        # measured in docs/PERFORMANCE.md), written out here because this file imports nothing from keyrank.
        options = ort.SessionOptions()
        options.intra_op_num_threads = _threads(config)
        options.inter_op_num_threads = 1  # a BERT graph is one chain: parallelism is within ops
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Fast and bounded: ONNX Runtime's CPU arena (1.5x on 512-token batches, idle machine) is shrunk
        # back after every run (_run_unless_cancelled's RunOptions), so the peak of a big batch is not
        # kept (a kept arena grew the stub to 2.37 GB after maxp bursts; docs/RELIABILITY.md). The
        # memory pattern, which plans one buffer per shape, stays off.
        options.enable_cpu_mem_arena = True
        options.enable_mem_pattern = False
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")  # ONNX Runtime's default, on purpose
        # model.onnx is the CPU variant `keyrank prepare --cpu-variant` chose and gated, on the runtime
        # runtime.json names (keyrank/scoring/openvino.py; ONNX Runtime when it is absent)
        here = Path(__file__).resolve().parent
        runtime = json.loads((here / "runtime.json").read_text()) if (here / "runtime.json").is_file() else {}
        self.device = None
        """"cuda" where the session runs on ONNX Runtime's CUDA provider (runs then go through I/O binding)."""
        if runtime.get("runtime") == "openvino" and _has_openvino():
            self.session = _OpenVino(here / "model.onnx", runtime.get("precision", "f32"), options.intra_op_num_threads)
            self.session_inputs = self.session.input_names
        else:
            providers = ["CPUExecutionProvider"]
            if runtime.get("device") == "cuda":  # the fp16 graph of triton-embedded-cuda-ort/ (keyrank/prepare/ort_cuda.py)
                providers = _cuda_providers() or providers
            self.session = ort.InferenceSession(str(here / "model.onnx"), options, providers=providers)
            if runtime.get("device") == "cuda":
                if self.session.get_providers()[0] == "CUDAExecutionProvider":
                    self.device = "cuda"
                else:
                    print("keyrank: runtime.json asks for ONNX Runtime's CUDA provider, which this onnxruntime lacks or "
                          "could not start (install onnxruntime-gpu, and a GPU); running the fp16 graph on the CPU", file=sys.stderr)
            # A fused graph may drop an input the model never reads (XLM-R's token_type_ids): Triton's config
            # keeps the export's inputs for every client, and the session is fed only those it declares.
            self.session_inputs = frozenset(i.name for i in self.session.get_inputs())
        # On the GPU a batch runs whole: its memory is the GPU's, and slices would starve it.
        default = 0 if self.device else OPENVINO_RUN_TOKENS if isinstance(self.session, _OpenVino) else RUN_TOKENS
        self.run_tokens = int(os.environ.get(RUN_TOKENS_ENV) or default)
        self.failures = 0
        """Runs failed in a row (``_run``)."""
        self.fault_file = os.environ.get(FAULT_FILE_ENV)
        """``FAULT_FILE_ENV``'s path, if set."""

    def execute(self, requests: list) -> list:
        return execute_grouped(requests, self.input_names, self.output_names, self._run)

    def _run(self, batch: dict, batch_requests: list) -> list:
        """One equal-shape batch; counts the runs that fail in a row and exits at ``FAILURES_BEFORE_EXIT``."""
        feeds = {name: array for name, array in batch.items() if name in self.session_inputs}
        try:
            if self.fault_file and os.path.exists(self.fault_file):
                raise RuntimeError(f"injected fault ({FAULT_FILE_ENV} {self.fault_file} exists)")
            outputs = _run_in_slices(self.session, self.output_names, feeds, batch_requests, self.run_tokens, self.device)
        except Exception as exc:
            if not all(request.is_cancelled() for request in batch_requests):  # a stop on cancel is no failure
                self.failures += 1
                if self.failures >= FAILURES_BEFORE_EXIT:
                    print(f"keyrank: {self.failures} runs failed in a row, the last with: {exc}; "
                          "exiting so that the model is loaded again", file=sys.stderr, flush=True)
                    os._exit(70)  # EX_SOFTWARE; the supervisor reloads the model
            raise
        self.failures = 0
        return outputs

    def finalize(self) -> None:
        self.session = None


_CANCEL_POLL_S = 0.005
"""How often a running batch asks whether all its requests were cancelled."""
_FROZEN_S = 0.5
"""A poll that comes this late means the stub was frozen (SIGSTOP): Triton may have failed and freed
its requests meanwhile ("Stub process ... is not healthy")."""


class Stopped(RuntimeError):
    """Every request of the batch was cancelled: the rest of its slices were not run."""


def _run_in_slices(session, output_names: list, batch: dict, requests: list, run_tokens: int, device: str | None = None) -> list:
    """``_run_unless_cancelled`` over row slices of at most ``run_tokens`` tokens each, outputs joined; stops
    between slices once every request of the batch has been cancelled (``Stopped``)."""
    rows, width = next(iter(batch.values())).shape
    step = rows if run_tokens <= 0 else max(1, run_tokens // max(1, width))
    if rows <= step:
        return _run_unless_cancelled(session, output_names, batch, requests, device)
    parts = []
    for i in range(0, rows, step):
        if i and all(request.is_cancelled() for request in requests):
            raise Stopped(f"cancelled after {i} of {rows} rows")
        parts.append(_run_unless_cancelled(session, output_names, {k: v[i : i + step] for k, v in batch.items()}, requests, device))
    return [np.concatenate([part[j] for part in parts]) for j in range(len(output_names))]


def _run_unless_cancelled(session, output_names: list, batch: dict, requests: list, device: str | None = None) -> list:
    """``session.run``, terminated early when every request of the batch has been cancelled (ONNX Runtime's
    RunOptions.terminate or OpenVINO's InferRequest.cancel, then its reset run, from a watcher thread).
    On the GPU (``device`` "cuda") through I/O binding: inputs copied once, outputs copied back once."""
    if isinstance(session, _OpenVino):
        return session.run(output_names, batch, requests)
    options = ort.RunOptions()
    # the arena given back (the GPU's too)
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0;gpu:0" if device == "cuda" else "cpu:0")
    with _stopped_when_cancelled(requests, lambda: setattr(options, "terminate", True)):
        if device is None:
            return session.run(output_names, batch, options)
        binding = session.io_binding()  # keyrank/scoring/local.py run_bound, written out
        for name, array in batch.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in output_names:
            binding.bind_output(name, device)
        session.run_with_iobinding(binding, options)
        return binding.copy_outputs_to_cpu()


def _cuda_providers() -> list | None:
    """CUDA, then the CPU (keyrank/scoring/local.py cuda_providers, written out); None without CUDA."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    if hasattr(ort, "preload_dlls"):  # CUDA and cuDNN from the nvidia-* wheels (PyTorch's) where the system has none
        ort.preload_dlls()
    return [("CUDAExecutionProvider", {"device_id": 0, "arena_extend_strategy": "kSameAsRequested"}), "CPUExecutionProvider"]


@contextmanager
def _stopped_when_cancelled(requests: list, stop):
    """While the body runs, a watcher thread calls ``stop()`` once every request has been cancelled."""
    done = threading.Event()

    def watch() -> None:
        polled = time.monotonic()
        while not done.wait(_CANCEL_POLL_S):
            if time.monotonic() - polled > _FROZEN_S:
                # is_cancelled() hands Triton the request's response factory, which Triton freed if it
                # gave up on this stub while it was frozen: asking then crashed tritonserver (SIGSEGV in
                # TRITONBACKEND_ResponseFactoryIsCancelled). So stop asking; the run finishes (a busy box
                # that merely starved this thread loses only the early stop of this one batch).
                return
            if all(request.is_cancelled() for request in requests):
                stop()
                return
            polled = time.monotonic()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def _has_openvino() -> bool:
    import importlib.util

    if importlib.util.find_spec("openvino") is None:  # the fp32 export is served unchanged: ONNX Runtime gives fp32's scores
        print("keyrank: runtime.json asks for OpenVINO, which is not installed here; running ONNX Runtime", file=sys.stderr)
        return False
    return True


class _OpenVino:
    """OpenVINO's CPU plugin on model.onnx (keyrank/scoring/openvino.py, written out): bf16 where the CPU
    has it, latency hint, one stream, one infer request (an instance runs one batch at a time).

    A cancel inside a run leaves the compiled model's shape inference half-updated (openvino 2026.4.1):
    the next runs of the shape run before the cancelled one failed ("Failed to broadcast-merge input
    shapes"), on any infer request of the compiled model, until a run of another shape. So every run that
    was cancelled is followed by one of a single token (``RESET_SHAPE``, a shape no batch has), which
    infers every node's shape anew: 75 of 75 cancels (5 shapes x 5 shapes x 3 delays) left every
    later run exact, against 5 broken without it (docs/RELIABILITY.md, "Preemption that cannot break the
    model"). Should a run fail all the same, ``FAILURES_BEFORE_EXIT`` ends the process and the model is
    loaded again."""

    RESET_SHAPE = (1, 1)

    def __init__(self, path: Path, precision: str, threads: int) -> None:
        import openvino as ov

        core = ov.Core()
        if precision == "bf16" and "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
            precision = "f32"
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", {
            "INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
        })
        self.request = self.compiled.create_infer_request()
        self.input_names = frozenset(port.get_any_name() for port in self.compiled.inputs)

    def run(self, output_names: list, batch: dict, requests: list) -> list:
        cancelled = threading.Event()

        def stop() -> None:
            cancelled.set()
            self.request.cancel()

        try:
            with _stopped_when_cancelled(requests, stop):
                self.request.infer(batch)
            return [self.request.get_tensor(name).data.copy() for name in output_names]
        finally:
            if cancelled.is_set():  # the watcher has stopped: no cancel can come after this reset
                self.request.infer({name: np.ones(self.RESET_SHAPE, dtype=np.int64) if name != "token_type_ids"
                                    else np.zeros(self.RESET_SHAPE, dtype=np.int64) for name in self.input_names})


def _threads(config: dict) -> int:
    """Env, then config parameter; 0/unset = the usable CPUs (``CORES_ENV`` where set, else the affinity) divided
    among this model's instances."""
    value = os.environ.get(THREADS_ENV) or config.get("parameters", {}).get("intra_op_thread_count", {}).get(
        "string_value", "0"
    )
    if int(value) > 0:
        return int(value)
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
    cores = os.environ.get(CORES_ENV, "")
    return max(1, (int(cores) if cores.isdigit() and int(cores) > 0 else len(os.sched_getaffinity(0))) // instances)
