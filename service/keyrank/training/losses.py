"""Ranking losses over training groups: scores [K] of one query's documents, relevant first.

- ``hinge``: KeyB's pairwise loss, max(0, margin - s+ + s-) averaged over the
  group's (relevant, non-relevant) pairs.
- ``listwise``: softmax cross-entropy of the relevant document against the
  sampled negatives (the loss ce-minilm-l6 was trained with).
- ``distillation``: KL from the teacher's softmax over the same documents
  (the base model's MaxP scores) to the student's, at a temperature; it keeps
  the fine-tuned scorer from forgetting what it knew.
"""

from __future__ import annotations

import torch

from keyrank.training.recipe import LOSSES


def hinge(scores: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """Mean over pairs of max(0, margin - s[0] + s[j]), j >= 1."""
    return torch.relu(margin - scores[0] + scores[1:]).mean()


def listwise(scores: torch.Tensor) -> torch.Tensor:
    """-log softmax(scores)[0]."""
    return -torch.log_softmax(scores, dim=0)[0]


def distillation(scores: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(scores / T)) * T^2 (the usual scale, so T does not shrink gradients)."""
    target = torch.softmax(teacher / temperature, dim=0)
    log_student = torch.log_softmax(scores / temperature, dim=0)
    return (target * (torch.log(target.clamp(min=1e-12)) - log_student)).sum() * temperature**2


def ranking_loss(name: str, scores: torch.Tensor, *, margin: float = 1.0) -> torch.Tensor:
    """The named ranking loss of one group."""
    if name == "hinge":
        return hinge(scores, margin)
    if name == "listwise":
        return listwise(scores)
    raise ValueError(f"unknown loss {name!r}; expected one of {LOSSES}")
