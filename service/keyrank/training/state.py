"""Resumable training state: out/state/latest.pt.

Weights (encoder and/or aggregator), optimizer and scheduler state, the RNG
states and the position (epoch, groups done, step): the epoch's group order is
a pure function of (seed, epoch), so a restarted run skips the groups it had
done and continues as if never stopped.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch


def save_state(run, optimizer, scheduler, position: dict, result, path: Path) -> None:
    """Everything a restart needs, written atomically (a crash mid-write keeps the previous state)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "position": dict(position), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "encoder": run.encoder.hf.state_dict() if run.encoder is not None else None,
        "aggregator": run.aggregator.state_dict() if run.aggregator is not None else None,
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        "history": result.history, "dev_before": result.dev_before, "best_epoch": result.best_epoch,
        "config": run.config.to_json(),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def restore_state(run, optimizer, scheduler, path: Path, result) -> dict:
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
    position = state["position"]
    for key, empty in (("losses", []), ("pairs", 0), ("seconds", 0.0)):
        position.setdefault(key, empty)
    return position
