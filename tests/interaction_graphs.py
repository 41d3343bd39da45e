"""Interaction strategies installed into a prepared model folder, as `keyrank finetune --install-into` leaves them:
the graph (encoder + chunk features) and the gateway's head, with weights moved away from their start so every one
counts; and, for a model server, the graph as a Triton model in both repositories."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from keyrank.interaction import features_file, head_file


def install(checkpoint: Path, models: Path, kind: str, *, seed: int = 0, triton: bool = False):
    """``kind``'s graph and head exported into ``models/gateway/`` (and, with ``triton``, written into ``triton/`` and
    ``triton-embedded/`` as ``<kind>-features``); the graph's and the head's PyTorch modules."""
    from keyrank.prepare import interaction as graph
    from keyrank.prepare.interaction import write_triton_models
    from keyrank.training import interaction as heads

    torch.manual_seed(seed)
    features = graph.build(checkpoint, kind)
    for learned in (features.translation, features.filters):
        if learned is not None:
            with torch.no_grad():  # every weight of T(q|d) or of the n-gram filters must count
                for p in learned.parameters():
                    p.add_(0.3 * torch.randn_like(p))
    graph.export(features, models)
    head = heads.build(features.layout, *classifier(models))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.5 * torch.randn_like(p))
    heads.export(head, models / "gateway" / head_file(kind))
    if triton:
        write_triton_models(models, models / "gateway" / features_file(kind))
    return features, head


def classifier(models: Path) -> tuple[np.ndarray, np.ndarray]:
    """The cross-encoder's own classification head (weight, bias), as `keyrank prepare` saved it."""
    with np.load(models / "gateway" / "classifier_head.npz") as head:
        return head["weight"], head["bias"]
