"""Resumable training state: out/state/latest.pt.

Weights (encoder and/or aggregator), optimizer and scheduler state, the RNG
states and the position (epoch, groups done, step): the epoch's group order is
a pure function of (seed, epoch), so a restarted run skips the groups it had
done and continues as if never stopped.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from keyrank.training.run import FinetuneResult, TrainingRun


@dataclass(slots=True)
class Position:
    """Where a run stands: what a restart continues from."""

    epoch: int = 0
    """Epochs finished."""
    groups_done: int = 0
    """Groups of the current epoch trained on (its order is a pure function of seed and epoch)."""
    step: int = 0
    """Optimizer steps taken over the whole run."""
    best: float | None = None
    """The best epoch's first dev measure so far (its epoch number without a dev set); None before any."""
    losses: list[float] = field(default_factory=list)
    """The current epoch's step losses (an epoch cut by an interruption keeps them across the restart)."""
    pairs: int = 0
    """Query-document pairs the current epoch has trained on."""
    seconds: float = 0.0
    """Training seconds the current epoch has taken."""

    def next_epoch(self, epoch: int) -> None:
        """``epoch`` epochs done: the next starts with nothing of its own."""
        self.epoch, self.groups_done, self.losses, self.pairs, self.seconds = epoch, 0, [], 0, 0.0


def save_state(run: TrainingRun, optimizer, scheduler, position: Position, result: FinetuneResult, path: Path) -> None:
    """Everything a restart needs, written atomically (a crash mid-write keeps the previous state)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "position": asdict(position), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "encoder": run.encoder.hf.state_dict() if run.encoder is not None else None,
        "aggregator": run.aggregator.state_dict() if run.aggregator is not None else None,
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        "history": result.history, "dev_before": result.dev_before, "best_epoch": result.best_epoch,
        "config": run.config.to_json(),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def restore_state(run: TrainingRun, optimizer, scheduler, path: Path, result: FinetuneResult) -> Position:
    """Load weights, optimizer, schedule and RNG into ``run``; answer the position to continue from."""
    state = torch.load(path, map_location="cpu", weights_only=False)  # optimizer and modules move it to their device
    if run.encoder is not None and state["encoder"] is not None:
        run.encoder.hf.load_state_dict(state["encoder"])
    if run.aggregator is not None and state["aggregator"] is not None:
        run.aggregator.load_state_dict(state["aggregator"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    result.history, result.dev_before, result.best_epoch = state["history"], state["dev_before"], state["best_epoch"]
    if result.best_epoch is not None:
        result.model_dir = run.out / "model" if (run.out / "model").is_dir() else None
        agg = run.out / f"{run.config.strategy}.onnx"
        result.aggregator = agg if agg.exists() else None
    return Position(**state["position"])  # a state saved before losses, pairs and seconds were kept: their defaults
