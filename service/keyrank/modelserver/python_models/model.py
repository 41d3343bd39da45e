"""Triton Python-backend model of the embedded server: runs the cross-encoder's
``model.onnx`` (next to this file) with ONNX Runtime on CPU.

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
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))  # grouping.py lies beside this file
from grouping import execute_grouped

THREADS_ENV = "KEYRANK_EMBEDDED_ORT_THREADS"
"""Overrides the config's ``intra_op_thread_count`` parameter."""
RUN_TOKENS_ENV = "KEYRANK_EMBEDDED_RUN_TOKENS"
"""Overrides ``RUN_TOKENS``; 0 = one run per batch, however big."""
RUN_TOKENS = 4096
"""Tokens (rows x width) of one ONNX Runtime run: a bigger batch runs in slices of at most this many
(8 x 512, 32 x 128), so the stub's peak memory does not grow with what the dynamic batcher merged
(docs/RELIABILITY.md, "Memory of the model process")."""


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
        # model.onnx is the CPU variant `keyrank prepare --cpu-variant` chose and gated (fused by default)
        path = Path(__file__).resolve().parent / "model.onnx"
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        # A fused graph may drop an input the model never reads (XLM-R's token_type_ids): Triton's config
        # keeps the export's inputs for every client, and the session is fed only those it declares.
        self.session_inputs = frozenset(i.name for i in self.session.get_inputs())
        self.run_tokens = int(os.environ.get(RUN_TOKENS_ENV) or RUN_TOKENS)

    def execute(self, requests: list) -> list:
        def run(batch: dict, batch_requests: list) -> list:
            feeds = {name: array for name, array in batch.items() if name in self.session_inputs}
            return _run_in_slices(self.session, self.output_names, feeds, batch_requests, self.run_tokens)

        return execute_grouped(requests, self.input_names, self.output_names, run)

    def finalize(self) -> None:
        self.session = None


_CANCEL_POLL_S = 0.05
"""How often a running batch asks whether all its requests were cancelled."""
_FROZEN_S = 0.5
"""A poll that comes this late means the stub was frozen (SIGSTOP): Triton may have failed and freed
its requests meanwhile ("Stub process ... is not healthy")."""


def _run_in_slices(session, output_names: list, batch: dict, requests: list, run_tokens: int) -> list:
    """``_run_unless_cancelled`` over row slices of at most ``run_tokens`` tokens each, outputs joined."""
    rows, width = next(iter(batch.values())).shape
    step = rows if run_tokens <= 0 else max(1, run_tokens // max(1, width))
    if rows <= step:
        return _run_unless_cancelled(session, output_names, batch, requests)
    parts = [_run_unless_cancelled(session, output_names, {k: v[i : i + step] for k, v in batch.items()}, requests)
             for i in range(0, rows, step)]
    return [np.concatenate([part[j] for part in parts]) for j in range(len(output_names))]


def _run_unless_cancelled(session, output_names: list, batch: dict, requests: list) -> list:
    """``session.run``, terminated early when every request of the batch has been cancelled
    (ONNX Runtime's RunOptions.terminate, set from a watcher thread)."""
    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")  # the arena given back
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
                options.terminate = True
                return
            polled = time.monotonic()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return session.run(output_names, batch, options)
    finally:
        done.set()
        watcher.join()


def _threads(config: dict) -> int:
    """Env, then config parameter; 0/unset = the usable CPUs divided among this model's instances."""
    value = os.environ.get(THREADS_ENV) or config.get("parameters", {}).get("intra_op_thread_count", {}).get(
        "string_value", "0"
    )
    if int(value) > 0:
        return int(value)
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
    return max(1, len(os.sched_getaffinity(0)) // instances)
