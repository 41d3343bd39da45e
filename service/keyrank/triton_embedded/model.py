"""Triton Python-backend model of the embedded server: runs the cross-encoder's
``model.onnx`` (next to this file) with ONNX Runtime on CPU.

Copied into ``models/triton-embedded/cross_encoder/1/`` by `keyrank prepare`;
it runs inside Triton's Python stub, so it imports nothing from keyrank.
The dynamic batcher hands ``execute`` several requests at once; those with
equal shapes (the gateway pads to length buckets) go through ONNX Runtime as
one batch, and the outputs are split back per request.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

THREADS_ENV = "KEYRANK_EMBEDDED_ORT_THREADS"
"""Overrides the config's ``intra_op_thread_count`` parameter."""


class TritonPythonModel:
    """One instance per ``instance_group`` count; each owns an ONNX Runtime session."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.output_names = [tensor["name"] for tensor in config["output"]]
        options = ort.SessionOptions()
        options.intra_op_num_threads = _threads(config)
        options.inter_op_num_threads = 1  # a BERT graph is one chain: parallelism is within ops
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        path = Path(__file__).resolve().parent / "model.onnx"
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def execute(self, requests: list) -> list:
        feeds = [
            {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.input_names}
            for request in requests
        ]
        groups: dict[tuple, list[int]] = {}
        for index, feed in enumerate(feeds):
            groups.setdefault(tuple(feed[name].shape[1:] for name in self.input_names), []).append(index)

        responses: list = [None] * len(requests)
        for members in groups.values():
            try:
                batch = {name: np.concatenate([feeds[i][name] for i in members]) for name in self.input_names}
                outputs = self.session.run(self.output_names, batch)
                bounds = np.cumsum([feeds[i][self.input_names[0]].shape[0] for i in members])[:-1]
                parts = [np.split(output.astype(np.float32, copy=False), bounds) for output in outputs]
                for position, index in enumerate(members):
                    tensors = [
                        pb_utils.Tensor(name, np.ascontiguousarray(part[position]))
                        for name, part in zip(self.output_names, parts)
                    ]
                    responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
            except Exception as exc:  # one bad group must not fail the other requests of the batch
                for index in members:
                    responses[index] = pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"cross_encoder: {exc}")
                    )
        return responses

    def finalize(self) -> None:
        self.session = None


def _threads(config: dict) -> int:
    """Env, then config parameter; 0/unset = the usable CPUs divided among this model's instances."""
    value = os.environ.get(THREADS_ENV) or config.get("parameters", {}).get("intra_op_thread_count", {}).get(
        "string_value", "0"
    )
    if int(value) > 0:
        return int(value)
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
    return max(1, len(os.sched_getaffinity(0)) // instances)
