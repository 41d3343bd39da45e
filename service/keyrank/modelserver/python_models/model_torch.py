"""Triton Python-backend model of the embedded repository's GPU variant: the cross-encoder
in PyTorch (``torch_encoder.py`` beside this file), fp16/bf16 with scaled-dot-product
attention, on the device the config names (``cuda``; ``cpu`` in tests).

Copied into ``models/triton-embedded-cuda/cross_encoder/1/model.py`` by
``keyrank.prepare.gpu_repository``; it runs inside Triton's Python stub, so it imports
nothing from keyrank. Same tensors and the same grouping as the ONNX variant
(modelserver/python_models/model.py): requests of equal shape from the dynamic batcher run
as one batch, cancelled requests are skipped.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


sys.dont_write_bytecode = True  # no __pycache__ beside the model: see model.py
sys.path.insert(0, str(Path(__file__).resolve().parent))  # torch_encoder.py, grouping.py lie beside this file
from grouping import execute_grouped
from torch_encoder import TorchCrossEncoder

SETTINGS = {"device": "KEYRANK_EMBEDDED_DEVICE", "dtype": "KEYRANK_EMBEDDED_DTYPE", "cuda_graphs": "KEYRANK_EMBEDDED_CUDA_GRAPHS",
            "compile": "KEYRANK_EMBEDDED_COMPILE"}
"""Config parameter -> environment variable that overrides it (the gateway's settings of the same name)."""


def _parameter(config: dict, name: str, default: str) -> str:
    value = os.environ.get(SETTINGS[name])
    if value:
        return value
    return config.get("parameters", {}).get(name, {}).get("string_value", default)


def _flag(config: dict, name: str) -> bool:
    return _parameter(config, name, "false").lower() in ("1", "true", "yes")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.output_names = [tensor["name"] for tensor in config["output"]]
        self.encoder = TorchCrossEncoder(
            Path(__file__).resolve().parent,
            device=_parameter(config, "device", "cuda"),
            dtype=_parameter(config, "dtype", "bfloat16"),
            cuda_graphs=_flag(config, "cuda_graphs"),
            compiled=_flag(config, "compile"),
        )

    def execute(self, requests: list) -> list:
        return execute_grouped(requests, self.input_names, self.output_names, self._run)

    def _run(self, batch: dict, _requests: list) -> list:
        logits, pooled = self.encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        outputs = {"logits": logits, "pooled": pooled}
        return [outputs[name] for name in self.output_names]

    def finalize(self) -> None:
        self.encoder = None
