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


class ModelList(Wire):
    """GET /v1/models: the served models, OpenAI's list shape (read by OpenAI, vLLM and Infinity clients)."""

    object: Literal["list"] = "list"
    """Always "list"."""
    data: list[ModelCard]
    """One entry per served model."""
