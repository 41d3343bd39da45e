"""What a fine-tuning run leaves (training/loop.py): the checkpoint and/or the trained aggregator or head with
its ONNX export, the parity check of the checkpoint's export, and out/training.json."""

from __future__ import annotations

import json
import shutil
import time
import torch

from keyrank.training import interaction, parade
from keyrank.training.model import CrossEncoder
from keyrank.training.run import FinetuneResult, TrainingRun


def write_outputs(run: TrainingRun, result: FinetuneResult) -> None:
    """The current weights as the run's deliverables: the checkpoint folder and/or the aggregator's ONNX."""
    from keyrank.prepare.export import fingerprint as checkpoint_fingerprint

    fingerprint = run.manifest["cross_encoder"]["fingerprint"]
    if isinstance(run.encoder, CrossEncoder):
        model_dir = run.out / "model"
        tmp = run.out / "model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        run.encoder.save(tmp)
        shutil.rmtree(model_dir, ignore_errors=True)
        tmp.replace(model_dir)
        result.model_dir = model_dir
        fingerprint = checkpoint_fingerprint(model_dir)
    if run.aggregator is not None:
        kind = run.config.strategy
        path = run.out / f"{kind}.onnx"
        meta = {"encoder_fingerprint": fingerprint, "encoder": run.config.model, "epoch": result.best_epoch,
                "trained_encoder": run.encoder is not None}
        if run.spec.features is not None:  # the head, and beside it the graph whose features it was trained on
            graph = interaction.graph_of(run.encoder, run.out / "base", run.out / "graph", meta) or run.out / "base" / "gateway" / run.spec.features
            interaction.export(run.aggregator, path, meta, graph=graph)
        else:
            parade.export(run.aggregator, kind, path, meta)
        torch.save(run.aggregator.state_dict(), run.out / f"{kind}.pt")
        result.aggregator = path


def check_export(run: TrainingRun, result: FinetuneResult, timings: dict) -> None:
    """`keyrank prepare` of the written checkpoint: the ONNX parity check must pass (else this raises)."""
    from keyrank.prepare.export import prepare

    started = time.perf_counter()
    if result.model_dir is not None:
        out = run.out / "prepared"
        # Keep a bi-encoder someone prepared there (dense/hybrid keyb2); do not export one just for the check.
        bi_encoder = "auto" if (out / "gateway" / "bi_encoder").is_dir() else None
        manifest = prepare(str(result.model_dir), out, bi_encoder=bi_encoder)
        timings["export_max_abs_diff"] = manifest["cross_encoder"]["onnx_max_abs_diff"]
    timings["export_s"] = time.perf_counter() - started


def write_report(run: TrainingRun, result: FinetuneResult, timings: dict, n_train: int, n_dev: int) -> None:
    """out/training.json: the config, data sizes, per-epoch loss and dev metric, timings (rewritten each epoch)."""
    report = {
        "config": run.config.to_json(), "base_fingerprint": run.manifest["cross_encoder"]["fingerprint"],
        "settings": run.settings.model_dump(mode="json", exclude={"api_key"}), "train_queries": n_train,
        "dev_queries": n_dev, "dev_before": result.dev_before, "history": result.history, "best_epoch": result.best_epoch,
        "model_dir": str(result.model_dir) if result.model_dir else None,
        "aggregator": str(result.aggregator) if result.aggregator else None,
        "readers": result.readers, "finished": result.finished, "timings": {k: (v if "diff" in k else round(v, 1)) for k, v in timings.items()},
        "device": str(run.device), "threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    (run.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
