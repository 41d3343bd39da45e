"""``finetune``: prepare the base model, plan the data with the serving pipeline, train, check, write.

    out/base/        `keyrank prepare` of the starting checkpoint: its template plans the data,
                     its ONNX graph computes frozen pooled vectors (and the default teacher's scores)
    out/cache/       teacher scores, pooled vectors (computed once; --cache-dir shares them)
    out/state/       latest.pt: weights, optimizer, scheduler, RNG, position (resumable)
    out/model/       the fine-tuned checkpoint (best dev epoch): `keyrank prepare --model out/model`
    out/<kind>.onnx  PARADE runs: the trained aggregator, served from models/gateway/; CEDR: the
                     trained head, and out/<kind>-features.onnx the interaction graph it reads
    out/prepared/    the export of out/model (the ONNX parity check, run at the end)
    out/training.json  config, data sizes, per-epoch loss and dev metric, speed
"""

from __future__ import annotations

import math
import random
import sys
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from keyrank.resolved import Resolved
from keyrank.training import interaction, readers
from keyrank.training.cache import PooledVectors, TeacherScores
from keyrank.training.outputs import check_export, write_outputs, write_report
from keyrank.training.planned import PlannedQuery, epoch_groups, plan_all, planning_strategy, training_request
from keyrank.training.recipe import FinetuneConfig, load_judged, readers_dev
from keyrank.training.run import DEV_MEASURES, FinetuneResult, TrainingRun
from keyrank.training.state import Position, restore_state, save_state


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _optimizer(run: TrainingRun) -> torch.optim.Optimizer:
    """AdamW; no decay on biases and norms; the aggregator at its own learning rate."""
    c = run.config
    groups = []
    aggregator_lr = c.aggregator_lr or (1e-4 if c.strategy == "parade-transformer" else 1e-3)
    graph_lr = aggregator_lr if run.spec.features is not None else c.lr  # Model 1's translation network starts from scratch
    for module, lr in ((run.encoder, graph_lr), (run.aggregator, aggregator_lr)):
        if module is None:
            continue
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        flat = [p for n, p in named if p.ndim < 2 or "norm" in n.lower()]
        decayed = [p for n, p in named if not (p.ndim < 2 or "norm" in n.lower())]
        groups += [{"params": decayed, "lr": lr, "weight_decay": c.weight_decay}, {"params": flat, "lr": lr, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups)


def _schedule(optimizer, total_steps: int, warmup: float):
    warm = max(1, round(total_steps * warmup))
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warm, max(0.0, (total_steps - step) / max(1, total_steps - warm)))
    )


def finetune(config: FinetuneConfig | None = None, /, **kwargs) -> FinetuneResult:
    """Fine-tune ``config.model`` for ``config.strategy`` (see FinetuneConfig); resumable, seeded."""
    c = config or FinetuneConfig(**kwargs)
    if c.threads:
        torch.set_num_threads(c.threads)
    _seed(c.seed)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    run = TrainingRun(c)
    resolved = training_request(run.pipeline, c.strategy, c.selector if run.spec.needs_selector else None)
    train, dev = _plan(run, resolved)
    timings["prepare_and_plan_s"] = time.perf_counter() - started
    started = time.perf_counter()
    _fill_caches(run, train, dev)
    timings["caches_s"] = time.perf_counter() - started
    run.build_modules()
    _seed(c.seed)  # initialisation does not depend on how much was planned
    steps = _Steps(run, train)
    result = FinetuneResult(run.out, None, None)
    position = _start(run, steps, result, dev)
    started, steps_now = time.perf_counter(), 0
    for epoch in range(position.epoch, c.epochs):
        steps_now, stopped = _train_epoch(run, steps, position, result, train, epoch, steps_now)
        if stopped:
            return result
        _end_epoch(run, steps, position, result, dev, epoch)
        timings["train_s"] = time.perf_counter() - started
        write_report(run, result, timings, len(train), len(dev))  # a run stopped later still has its report
        steps.save(position, result)
    timings["train_s"] = time.perf_counter() - started
    if result.best_epoch is not None and (result.model_dir or result.aggregator):
        check_export(run, result, timings)
        started = time.perf_counter()
        dev_set = run.dev_judged[: c.readers_max_queries] + readers_dev(c, run.pipeline.tokenizer)
        result.readers = readers.measure(run, result, dev_set, tuple(c.readers), run.out / "prepared")
        timings["readers_s"] = time.perf_counter() - started
    result.finished = True
    write_report(run, result, timings, len(train), len(dev))
    return result


def _log(message: str) -> None:
    print(f"[finetune] {message}", file=sys.stderr, flush=True)


def _plan(run: TrainingRun, resolved: Resolved) -> tuple[list[PlannedQuery], list[PlannedQuery]]:
    """The training and dev queries, planned by the serving pipeline under the run's one ``resolved`` request (dev:
    the first ``dev_max_queries``); keeps every dev query in ``run.dev_judged`` and, for a mixed run, the training
    queries as ``mix`` reads them in ``run.mixed``."""
    c = run.config
    train_j, run.dev_judged = load_judged(c, run.pipeline.tokenizer)
    dev_j = run.dev_judged[: c.dev_max_queries]
    if not dev_j:
        _log("warning: the dev set is empty (no held-out query with a relevant and a non-relevant candidate): no dev "
             "metric, and the last epoch is kept; give more queries or --dev-max-queries > 0")
    # A selector the model scores (cross) selects with the base model, as served before fine-tuning (loaded only then).
    cross = lambda inputs: run.reranker().scorer.score_sync(inputs, want_pooled=False).logits
    train = plan_all(run.pipeline, train_j, resolved, cross, desc="plan train", progress=c.progress)
    dev = plan_all(run.pipeline, dev_j, resolved, cross, desc="plan dev", progress=c.progress)
    _log(f"{len(train)} training queries ({sum(q.judged.trainable for q in train)} trainable), {len(dev)} dev queries, "
         f"{sum(len(q.ids) for q in train)} training sequences planned for {c.strategy}")
    if run.mix_spec is not None:  # the same queries, in the same order, as the mixed strategy reads them
        mixed = training_request(run.pipeline, c.mix, c.selector if run.mix_spec.needs_selector else None)
        run.mixed = plan_all(run.pipeline, train_j, mixed, cross, desc=f"plan {c.mix}", progress=c.progress)
        _log(f"and {sum(len(q.ids) for q in run.mixed)} for {c.mix} (weight {c.mix_weight})")
    return train, dev


def _fill_caches(run: TrainingRun, train: list[PlannedQuery], dev: list[PlannedQuery]) -> None:
    """The teacher's scores (distillation) and, for a frozen encoder, the pooled vectors or interaction features
    the trained aggregator or head reads, each computed once and kept on disk."""
    c = run.config
    if c.distill > 0:
        fingerprint, tag, serve = run.teacher_source()
        run.teacher = TeacherScores(run.cache_path(f"teacher-{c.teacher_strategy}{tag}", c.teacher_strategy, fingerprint).with_suffix(".jsonl"))
        run.teacher.fill(serve, [q.judged for q in train], strategy=c.teacher_strategy, progress=c.progress,
                         close=c.teacher is not None)  # the base model's own session stays for what follows
    if run.spec.features is not None and not c.trains_encoder:  # the graph the head reads, from the frozen encoder, as served
        run.layout = interaction.prepare_graph(c.model, run.out / "base", c.strategy, run.manifest["cross_encoder"]["fingerprint"])
    if not c.trains_encoder:
        # Named by the cut, not the aggregator: PARADE-Attn and -Transformer runs share one cache.
        cut_by = planning_strategy(c.strategy)
        what = f"pooled-{cut_by}" if run.spec.features is None else f"features-{c.strategy}"
        run.pooled = PooledVectors(run.cache_path(what, cut_by))
        run.pooled.fill(run.reranker().scorer_for(run.spec), train + dev, progress=c.progress)


class _Steps:
    """The optimizer, its schedule over every epoch's steps, and where their state is saved."""

    def __init__(self, run: TrainingRun, train: list[PlannedQuery]):
        c = run.config
        self.run = run
        self.optimizer = _optimizer(run)
        n_groups = len(epoch_groups(train, epoch=0, seed=c.seed, negatives=c.negatives, max_groups=c.max_groups))
        self.scheduler = _schedule(self.optimizer, c.epochs * math.ceil(n_groups / c.groups_per_step), c.warmup)
        self.path = run.out / "state" / "latest.pt"

    def take(self) -> None:
        """One optimizer step on the gradient accumulated, clipped."""
        params = [p for m in self.run.modules() for p in m.parameters() if p.requires_grad]
        torch.nn.utils.clip_grad_norm_(params, self.run.config.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def save(self, position: Position, result: FinetuneResult) -> None:
        save_state(self.run, self.optimizer, self.scheduler, position, result, self.path)


def _start(run: TrainingRun, steps: _Steps, result: FinetuneResult, dev: list[PlannedQuery]) -> Position:
    """Where training starts: the saved position of a run resumed, else the beginning (after the starting model's
    dev metric)."""
    if run.config.resume and steps.path.exists():
        position = restore_state(run, steps.optimizer, steps.scheduler, steps.path, result)
        _log(f"resumed at epoch {position.epoch}, group {position.groups_done} (step {position.step})")
        return position
    result.dev_before = run.evaluate(dev)
    _log(f"dev before training: {result.dev_before}")
    return Position()


def _train_epoch(run: TrainingRun, steps: _Steps, position: Position, result: FinetuneResult,
                 train: list[PlannedQuery], epoch: int, steps_now: int) -> tuple[int, bool]:
    """The epoch's steps from ``position`` on; answers the steps this invocation took and whether it stopped as
    asked (``stop_after_steps``) before the epoch's end."""
    c = run.config
    groups = epoch_groups(train, epoch=epoch, seed=c.seed, negatives=c.negatives, max_groups=c.max_groups)
    bar = tqdm(total=len(groups), initial=position.groups_done, desc=f"epoch {epoch + 1}/{c.epochs}", unit="group",
               disable=not c.progress, mininterval=2.0)
    # An epoch cut by an interruption keeps its losses and pace across the restart.
    epoch_started = time.perf_counter() - position.seconds
    for first in range(position.groups_done, len(groups), c.groups_per_step):
        step_groups = groups[first : first + c.groups_per_step]
        loss, pairs = run.step_loss(train, step_groups)
        steps.take()
        position.losses.append(loss)
        position.pairs += pairs
        position.groups_done, position.step = first + len(step_groups), position.step + 1
        position.seconds = time.perf_counter() - epoch_started
        steps_now += 1
        bar.update(len(step_groups))
        bar.set_postfix(loss=f"{np.mean(position.losses[-20:]):.4f}", ex_s=f"{position.pairs / position.seconds:.2f}")
        stop = c.stop_after_steps is not None and steps_now >= c.stop_after_steps and position.groups_done < len(groups)
        if position.step % c.checkpoint_every == 0 or stop:
            steps.save(position, result)
        if stop:
            bar.close()
            _log(f"stopped after {steps_now} steps as asked (epoch {epoch + 1}, group {position.groups_done}); run again to continue")
            return steps_now, True
    bar.close()
    position.seconds = time.perf_counter() - epoch_started
    return steps_now, False


def _end_epoch(run: TrainingRun, steps: _Steps, position: Position, result: FinetuneResult,
               dev: list[PlannedQuery], epoch: int) -> None:
    """The epoch's dev metric and history entry; its weights written when they are the best so far."""
    dev_metrics = run.evaluate(dev)
    losses, seconds = position.losses, position.seconds
    entry = {"epoch": epoch + 1, "loss": round(float(np.mean(losses)), 4) if losses else None, "dev": dev_metrics,
             "seconds": round(seconds, 1), "pairs_per_s": round(position.pairs / max(seconds, 1e-9), 2), "steps": position.step}
    result.history.append(entry)
    _log(f"epoch {epoch + 1}: {entry}")
    key = dev_metrics.get(DEV_MEASURES[0], -math.inf) if dev_metrics else epoch
    if position.best is None or key > position.best:
        position.best = key
        result.best_epoch = epoch + 1
        write_outputs(run, result)
    position.next_epoch(epoch + 1)
