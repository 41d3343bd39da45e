"""OpenAI-style discovery: GET /v1/models, read by OpenAI, vLLM and Infinity clients."""

from __future__ import annotations

from typing import Literal

from keyrank.schemas.common import Wire


class ModelCard(Wire):
    """One entry of GET /v1/models (OpenAI's model object)."""

    id: str
    """The model's name, as answers report it and as a request's ``model`` names it."""
    object: Literal["model"] = "model"
    """Always "model"."""
    created: int
    """Unix time the model was prepared (its manifest was written)."""
    owned_by: str = "keyrank"
    """Who serves it."""
    runtime: str
    """keyrank's extension: what computes its scores: ``openvino``, ``onnxruntime``, ``torch``, ``tensorrt`` or
    ``unknown`` (an external Triton that does not say; api/served.py)."""
    precision: str
    """keyrank's extension: what it computes in: ``bfloat16``, ``float16``, ``float32``, ``int8`` or ``unknown``."""
    device: str
    """keyrank's extension: ``cpu``, ``cuda`` or ``unknown``."""


class ModelList(Wire):
    """GET /v1/models: the served models, OpenAI's list shape (read by OpenAI, vLLM and Infinity clients)."""

    object: Literal["list"] = "list"
    """Always "list"."""
    data: list[ModelCard]
    """One entry per served model."""
