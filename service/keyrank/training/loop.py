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

import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from keyrank.select import REGISTRY as SELECTOR_REGISTRY
from keyrank.training import interaction, parade
from keyrank.training.cache import PooledVectors, TeacherScores, cache_key, shaping
from keyrank.training.losses import distillation, ranking_loss
from keyrank.training.model import Batch, CrossEncoder, fold
from keyrank.training.outputs import check_export, write_outputs, write_report
from keyrank.training.planned import (
    PlannedQuery,
    TrainingGroup,
    epoch_groups,
    plan_all,
    planning_strategy,
    spec_of,
)
from keyrank.training.recipe import FinetuneConfig, load_judged
from keyrank.training.state import restore_state, save_state

DEV_MEASURES = ("nDCG@10", "RR@10")
"""Dev metrics reported every epoch (ir-measures, as `keyrank eval`); the first picks the epoch kept."""


@dataclass(slots=True)
class FinetuneResult:
    """What a run wrote and measured."""

    out: Path
    """The run folder."""
    model_dir: Path | None
    """The fine-tuned checkpoint folder (None when only an aggregator was trained)."""
    aggregator: Path | None
    """The PARADE aggregator's ONNX file (PARADE runs)."""
    history: list[dict] = field(default_factory=list)
    """Per epoch: mean loss, dev metrics, seconds, pairs/s."""
    dev_before: dict = field(default_factory=dict)
    """Dev metrics of the starting model, same scoring."""
    best_epoch: int | None = None
    """The epoch whose weights were written (by the first dev measure)."""
    finished: bool = False
    """False when ``stop_after_steps`` ended this invocation early (run it again to continue)."""


class TrainingRun:
    """The state one training run carries between its stages."""

    def __init__(self, config: FinetuneConfig):
        from keyrank.config import get_settings
        from keyrank.prepare.export import prepare
        from keyrank.pipeline import Pipeline

        self.config = c = config
        self.spec = spec_of(c.strategy)
        self.out = Path(c.out)
        self.device = torch.device(c.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        row = SELECTOR_REGISTRY.get(c.selector) if self.spec.needs_selector else None  # unknown names: refused at planning
        needs_dense = row is not None and row.bi_encoder
        self.manifest = prepare(c.model, self.out / "base", bi_encoder="auto" if needs_dense else None)
        self.settings = get_settings().with_overrides(model_dir=self.out / "base", **c.settings)
        self.pipeline = Pipeline.from_model_dir(self.settings)
        self.pad_id = self.pipeline.template.pad_id
        self._reranker = None
        self.encoder: CrossEncoder | None = None
        self.aggregator: torch.nn.Module | None = None
        self.teacher: TeacherScores | None = None
        self.pooled: PooledVectors | None = None
        self.layout = None  # the interaction graph's FeatureLayout (CEDR), once it is in out/base/gateway/

    def reranker(self):
        """The base model served in-process (ONNX Runtime): teacher, pooled vectors, cross selection."""
        if self._reranker is None:
            from keyrank.reranker import Reranker

            self._reranker = Reranker.local(settings=self.settings, threads=self.config.threads or 0)
        return self._reranker

    def teacher_source(self):
        """The teacher's model fingerprint, the cache name's runtime tag ("" for ONNX Runtime, the served
        CPU path; "-torch-<dtype>" for the PyTorch variant), and how to serve it in-process: called only
        for scores the cache lacks, so a filled cache never loads the teacher."""
        from keyrank.reranker import Reranker

        c = self.config
        if c.teacher is None:
            return self.manifest["cross_encoder"]["fingerprint"], "", self.reranker
        settings = self.settings.with_overrides(model_dir=Path(c.teacher))
        fingerprint = json.loads((settings.gateway_dir / "manifest.json").read_text())["cross_encoder"]["fingerprint"]
        runtime = c.teacher_runtime if c.teacher_runtime != "auto" else ("torch" if self.device.type == "cuda" else "onnx")
        if runtime not in ("onnx", "torch"):
            raise ValueError(f"teacher_runtime {c.teacher_runtime!r}: expected auto, onnx or torch")
        if runtime == "torch":  # the teacher's GPU variant on the training device: minutes instead of hours of CPU
            _, dtype = Reranker.torch_variant(settings)
            return fingerprint, f"-torch-{dtype}", lambda: Reranker.torch(settings=settings, device=str(self.device))
        return fingerprint, "", lambda: Reranker.local(settings=settings, threads=c.threads or 0)

    def cache_path(self, what: str, strategy: str, fingerprint: str | None = None) -> Path:
        """``<cache>/<what>-<fingerprint (default: the base model's)>-<hash of the settings shaping strategy's inputs>``."""
        settings = shaping(self.settings.model_dump(exclude={"model_dir", "api_key"}), strategy)
        folder = Path(self.config.cache_dir) if self.config.cache_dir else self.out / "cache"
        return folder / cache_key(fingerprint or self.manifest["cross_encoder"]["fingerprint"], settings, what)

    def build_modules(self) -> None:
        from keyrank.pipeline import RerankOptions

        c = self.config
        if c.trains_encoder:
            probe = self.pipeline.plan("what is a cat", ["a cat is an animal"], RerankOptions(strategy="firstp")).inputs
            if self.spec.features is not None:  # Model 1, CEDR-PACRR: the interaction graph, its learned part trained
                self.encoder = interaction.GraphEncoder(_checkpoint(c.model), c.strategy)
                self.layout = self.encoder.graph.layout
            else:
                self.encoder = CrossEncoder(_checkpoint(c.model), self.pipeline.template, probe, attention_dropout=c.attention_dropout)
            self.encoder = self.encoder.to(self.device).train()
        if self.spec.aggregation == "trained":
            with np.load(self.out / "base" / "gateway" / "classifier_head.npz") as head:
                weight, bias = head["weight"], head["bias"]
            module = interaction.build(self.layout, weight, bias) if self.layout else parade.build(c.strategy, int(weight.shape[1]), weight, bias)
            self.aggregator = module.to(self.device).train()

    # --- scoring -----------------------------------------------------------------------------
    def document_scores(self, parts: list[tuple[PlannedQuery, tuple[int, ...]]]) -> torch.Tensor:
        """Scores of the named documents of planned queries, concatenated, as serving folds them."""
        inputs, doc_of, pooled_rows, offset = None, [], [], 0
        for planned, docs in parts:
            chunk = planned.model_inputs(docs)
            inputs = chunk if inputs is None else inputs + chunk
            doc_of.append(planned.doc_of(docs) + offset)
            offset += len(docs)
            if self.encoder is None:
                pooled_rows.append(self.pooled.of(planned, docs))
        doc_of = np.concatenate(doc_of)
        if self.encoder is None:
            relevance, pooled = None, torch.from_numpy(np.concatenate(pooled_rows)).to(self.device)
        else:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                relevance, pooled = self.encoder(Batch.of(inputs, self.pad_id, self.device))
            relevance, pooled = relevance.float(), pooled.float()
        head = getattr(self.encoder, "head", None)
        return fold(self.spec.aggregation, relevance, pooled, doc_of, offset, self.aggregator, head)

    def modules(self) -> list[torch.nn.Module]:
        return [m for m in (self.encoder, self.aggregator) if m is not None]

    def evaluate(self, dev: list[PlannedQuery]) -> dict:
        """Dev metrics of the current weights: every candidate scored, ranked, measured by ir-measures."""
        from keyrank.data.runs import QueryRun, per_query

        if not dev:
            return {}
        for m in self.modules():
            m.eval()
        runs = []
        limit = max(1, self.config.sequences_per_forward * 2)
        with torch.no_grad():
            for planned in dev:
                scores, docs = [], list(range(len(planned.judged.doc_ids)))
                for chunk in _chunks(docs, lambda d, p=planned: len(p.sequences(d)), limit):
                    scores.append(self.document_scores([(planned, tuple(chunk))]).cpu().numpy())
                values = np.concatenate(scores)
                runs.append(QueryRun(planned.judged.qid, self.config.strategy, dict(zip(planned.judged.doc_ids, values.tolist()))))
        for m in self.modules():
            m.train()
        values = per_query([p.judged.as_eval_query() for p in dev], runs, DEV_MEASURES)
        return {m: round(float(np.mean([v[m] for v in values.values()])), 4) for m in DEV_MEASURES}

    # --- one optimizer step -----------------------------------------------------------------------
    def step_loss(self, train: list[PlannedQuery], groups: list[TrainingGroup]) -> tuple[float, int]:
        """Accumulate the gradient of the groups' mean loss; answer (loss, query-document pairs)."""
        c = self.config
        total, pairs = 0.0, 0
        size = lambda g: sum(len(train[g.query].sequences(d)) for d in g.docs)
        for micro in _chunks(groups, size, c.sequences_per_forward):
            scores = self.document_scores([(train[g.query], g.docs) for g in micro])
            loss, start = scores.new_zeros(()), 0
            for g in micro:
                s = scores[start : start + len(g.docs)]
                start += len(g.docs)
                loss = loss + ranking_loss(c.loss, s, margin=c.margin)
                if self.teacher is not None:
                    t = torch.from_numpy(self.teacher.of(train[g.query].judged, g.docs)).to(s.device)
                    loss = loss + c.distill * distillation(s, t, c.temperature)
                pairs += len(g.docs)
            (loss / len(groups)).backward()
            total += float(loss.detach())
        return total / len(groups), pairs


def _chunks(items, size, limit):
    """Consecutive items packed while their total size stays within ``limit`` (an oversized item goes alone)."""
    chunk, used = [], 0
    for item in items:
        n = size(item)
        if chunk and used + n > limit:
            yield chunk
            chunk, used = [], 0
        chunk.append(item)
        used += n
    if chunk:
        yield chunk


def _checkpoint(model: str) -> str:
    """A local folder as a path; a hub id as is (transformers resolves it)."""
    return str(Path(model).resolve()) if Path(model).is_dir() else model


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
    log = lambda msg: print(f"[finetune] {msg}", file=sys.stderr, flush=True)
    train_j, dev_j = load_judged(c, run.pipeline.tokenizer)
    if not dev_j:
        log("warning: the dev set is empty (no held-out query with a relevant and a non-relevant candidate): no dev "
            "metric, and the last epoch is kept; give more queries or --dev-max-queries > 0")
    selector = c.selector if run.spec.needs_selector else None
    cross = None
    if selector and SELECTOR_REGISTRY[selector].scored_by == "model":  # blocks selected by the base model, as served before fine-tuning
        cross = lambda inputs: run.reranker().scorer.score_sync(inputs, want_pooled=False).logits
    train = plan_all(run.pipeline, train_j, c.strategy, selector, cross, desc="plan train", progress=c.progress)
    dev = plan_all(run.pipeline, dev_j, c.strategy, selector, cross, desc="plan dev", progress=c.progress)
    timings["prepare_and_plan_s"] = time.perf_counter() - started
    log(f"{len(train)} training queries ({sum(q.judged.trainable for q in train)} trainable), {len(dev)} dev queries, "
        f"{sum(len(q.ids) for q in train)} training sequences planned for {c.strategy}")

    started = time.perf_counter()
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
    timings["caches_s"] = time.perf_counter() - started

    run.build_modules()
    _seed(c.seed)  # initialisation does not depend on how much was planned
    optimizer = _optimizer(run)
    n_groups = len(epoch_groups(train, epoch=0, seed=c.seed, negatives=c.negatives, max_groups=c.max_groups))
    steps_per_epoch = math.ceil(n_groups / c.groups_per_step)
    scheduler = _schedule(optimizer, c.epochs * steps_per_epoch, c.warmup)
    state_path = run.out / "state" / "latest.pt"
    result = FinetuneResult(run.out, None, None)
    position = {"epoch": 0, "groups_done": 0, "step": 0, "best": None, "losses": [], "pairs": 0, "seconds": 0.0}
    if c.resume and state_path.exists():
        position = restore_state(run, optimizer, scheduler, state_path, result)
        log(f"resumed at epoch {position['epoch']}, group {position['groups_done']} (step {position['step']})")
    else:
        result.dev_before = run.evaluate(dev)
        log(f"dev before training: {result.dev_before}")

    started, steps_now = time.perf_counter(), 0
    for epoch in range(position["epoch"], c.epochs):
        groups = epoch_groups(train, epoch=epoch, seed=c.seed, negatives=c.negatives, max_groups=c.max_groups)
        bar = tqdm(total=len(groups), initial=position["groups_done"], desc=f"epoch {epoch + 1}/{c.epochs}", unit="group",
                   disable=not c.progress, mininterval=2.0)
        # An epoch cut by an interruption keeps its losses and pace across the restart.
        losses, pairs_seen = position["losses"], position["pairs"]
        epoch_started = time.perf_counter() - position["seconds"]
        for first in range(position["groups_done"], len(groups), c.groups_per_step):
            step_groups = groups[first : first + c.groups_per_step]
            loss, pairs = run.step_loss(train, step_groups)
            params = [p for m in run.modules() for p in m.parameters() if p.requires_grad]
            torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss)
            pairs_seen += pairs
            position.update(groups_done=first + len(step_groups), step=position["step"] + 1, pairs=pairs_seen,
                            seconds=time.perf_counter() - epoch_started)
            steps_now += 1
            bar.update(len(step_groups))
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}", ex_s=f"{pairs_seen / position['seconds']:.2f}")
            stop = c.stop_after_steps is not None and steps_now >= c.stop_after_steps and position["groups_done"] < len(groups)
            if position["step"] % c.checkpoint_every == 0 or stop:
                save_state(run, optimizer, scheduler, position, result, state_path)
            if stop:
                bar.close()
                log(f"stopped after {steps_now} steps as asked (epoch {epoch + 1}, group {position['groups_done']}); run again to continue")
                return result
        bar.close()
        seconds = time.perf_counter() - epoch_started
        dev_metrics = run.evaluate(dev)
        entry = {"epoch": epoch + 1, "loss": round(float(np.mean(losses)), 4) if losses else None, "dev": dev_metrics,
                 "seconds": round(seconds, 1), "pairs_per_s": round(pairs_seen / max(seconds, 1e-9), 2), "steps": position["step"]}
        result.history.append(entry)
        log(f"epoch {epoch + 1}: {entry}")
        key = dev_metrics.get(DEV_MEASURES[0], -math.inf) if dev_metrics else epoch
        if position["best"] is None or key > position["best"]:
            position["best"] = key
            result.best_epoch = epoch + 1
            write_outputs(run, result)
        position.update(epoch=epoch + 1, groups_done=0, losses=[], pairs=0, seconds=0.0)
        timings["train_s"] = time.perf_counter() - started
        write_report(run, result, timings, len(train), len(dev))  # a run stopped later still has its report
        save_state(run, optimizer, scheduler, position, result, state_path)
    timings["train_s"] = time.perf_counter() - started
    if result.best_epoch is not None and (result.model_dir or result.aggregator):
        check_export(run, result, timings)
    result.finished = True
    write_report(run, result, timings, len(train), len(dev))
    return result
