"""Triton Python-backend model of the embedded repository's GPU variant: the cross-encoder
in PyTorch (``torch_encoder.py`` beside this file), fp16/bf16 with scaled-dot-product
attention, on the device the config names (``cuda``; ``cpu`` in tests).

Copied into ``models/triton-embedded-cuda/cross_encoder/1/model.py`` by
``keyrank.modelserver.gpu``; it runs inside Triton's Python stub, so it imports
nothing from keyrank. Same tensors and the same grouping as the ONNX variant
(modelserver/python_models/model.py): requests of equal shape from the dynamic batcher run
as one batch, cancelled requests are skipped.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, str(Path(__file__).resolve().parent))  # torch_encoder.py lies beside this file
from torch_encoder import TorchCrossEncoder

SETTINGS = {"device": "KEYRANK_EMBEDDED_DEVICE", "dtype": "KEYRANK_EMBEDDED_DTYPE", "cuda_graphs": "KEYRANK_EMBEDDED_CUDA_GRAPHS"}
"""Config parameter -> environment variable that overrides it (the gateway's settings of the same name)."""


def _parameter(config: dict, name: str, default: str) -> str:
    value = os.environ.get(SETTINGS[name])
    if value:
        return value
    return config.get("parameters", {}).get(name, {}).get("string_value", default)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.output_names = [tensor["name"] for tensor in config["output"]]
        self.encoder = TorchCrossEncoder(
            Path(__file__).resolve().parent,
            device=_parameter(config, "device", "cuda"),
            dtype=_parameter(config, "dtype", "bfloat16"),
            cuda_graphs=_parameter(config, "cuda_graphs", "false").lower() in ("1", "true", "yes"),
        )

    def execute(self, requests: list) -> list:
        responses: list = [None] * len(requests)
        live = []
        for index, request in enumerate(requests):
            if request.is_cancelled():  # the gateway cancels when its caller hangs up
                responses[index] = pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                )
            else:
                live.append(index)
        feeds = {
            index: {name: pb_utils.get_input_tensor_by_name(requests[index], name).as_numpy() for name in self.input_names}
            for index in live
        }
        groups: dict[tuple, list[int]] = {}
        for index, feed in feeds.items():
            groups.setdefault(tuple(feed[name].shape[1:] for name in self.input_names), []).append(index)
        for members in groups.values():
            try:
                batch = [np.concatenate([feeds[i][name] for i in members]) for name in ("input_ids", "attention_mask", "token_type_ids")]
                logits, pooled = self.encoder(*batch)
                outputs = {"logits": logits, "pooled": pooled}
                bounds = np.cumsum([feeds[i]["input_ids"].shape[0] for i in members])[:-1]
                parts = {name: np.split(outputs[name], bounds) for name in self.output_names}
                for position, index in enumerate(members):
                    tensors = [pb_utils.Tensor(name, np.ascontiguousarray(parts[name][position])) for name in self.output_names]
                    responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
            except Exception as exc:  # noqa: BLE001 -- one bad group must not fail the other requests of the batch
                for index in members:
                    responses[index] = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"cross_encoder: {exc}"))
        return responses

    def finalize(self) -> None:
        self.encoder = None
