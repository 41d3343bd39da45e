"""One fine-tuning run's state between its stages (``TrainingRun``) and what it wrote and measured
(``FinetuneResult``): the base model prepared and served in-process, the modules trained, the caches, and
the scoring and dev metric every stage of ``finetune`` (loop.py) shares."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from keyrank.aggregate import LENGTH_REFERENCE
from keyrank.select import REGISTRY as SELECTOR_REGISTRY
from keyrank.training import interaction, parade
from keyrank.training.cache import PooledVectors, TeacherScores, cache_key, shaping
from keyrank.training.losses import distillation, ranking_loss
from keyrank.training.model import Batch, CrossEncoder, fold
from keyrank.training.planned import PlannedQuery, TrainingGroup, spec_of
from keyrank.training.recipe import FinetuneConfig

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
    readers: dict | None = None
    """Dev metrics of each reader with the fine-tuned scorer and the one its serving settings name (readers.py)."""


class TrainingRun:
    """The state one training run carries between its stages."""

    def __init__(self, config: FinetuneConfig):
        from keyrank.config import get_settings
        from keyrank.prepare.export import prepare
        from keyrank.pipeline import Pipeline

        self.config = c = config
        self.spec = spec_of(c.strategy)
        self.mix_spec = _mix_spec(c)
        self.mixed: list[PlannedQuery] | None = None
        """The training queries planned as ``config.mix`` reads them (same order as the run's own), when mixed."""
        self.dev_judged: list = []
        """Every dev query (JudgedQuery), hash-ordered: each epoch reads the first ``dev_max_queries``, the readers
        ``readers_max_queries``."""
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
    def document_scores(self, parts: list[tuple[PlannedQuery, tuple[int, ...]]], aggregation: str | None = None) -> torch.Tensor:
        """Scores of the named documents of planned queries, concatenated, as serving folds them (by ``aggregation``,
        default the run's strategy's)."""
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
        method = aggregation or self.spec.aggregation
        bias = self.settings.keyb2_blocks_length_bias
        if method == "lse" and bias and relevance is not None:  # as serving weighs them (aggregate.length_calibrated)
            lengths = torch.tensor([len(ids) for ids in inputs.ids], dtype=relevance.dtype, device=relevance.device)
            relevance = relevance + bias * torch.log(lengths / LENGTH_REFERENCE)
        return fold(method, relevance, pooled, doc_of, offset, self.aggregator, head)

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
        """Accumulate the gradient of the groups' mean loss; answer (loss, query-document pairs). A mixed run adds
        ``mix_weight`` x the same groups' loss as ``mix`` reads them (its own forwards)."""
        total, pairs = self._groups_loss(train, groups, self.spec.aggregation, 1.0, self.teacher)
        if self.mixed is not None:
            total += self._groups_loss(self.mixed, groups, self.mix_spec.aggregation, self.config.mix_weight, None)[0]
        return total, pairs

    def _groups_loss(self, planned: list[PlannedQuery], groups: list[TrainingGroup], aggregation: str, weight: float,
                     teacher: TeacherScores | None) -> tuple[float, int]:
        """``weight`` x the groups' mean loss as ``planned`` reads them, its gradient accumulated."""
        c = self.config
        total, pairs = 0.0, 0
        size = lambda g: sum(len(planned[g.query].sequences(d)) for d in g.docs)
        for micro in _chunks(groups, size, c.sequences_per_forward):
            scores = self.document_scores([(planned[g.query], g.docs) for g in micro], aggregation)
            loss, start = scores.new_zeros(()), 0
            for g in micro:
                s = scores[start : start + len(g.docs)]
                start += len(g.docs)
                loss = loss + ranking_loss(c.loss, s, margin=c.margin)
                if teacher is not None:
                    t = torch.from_numpy(teacher.of(planned[g.query].judged, g.docs)).to(s.device)
                    loss = loss + c.distill * distillation(s, t, c.temperature)
                pairs += len(g.docs)
            (loss * weight / len(groups)).backward()
            total += weight * float(loss.detach())
        return total / len(groups), pairs


def _mix_spec(c: FinetuneConfig):
    """The registry row of ``c.mix``; raises ValueError for a mix that cannot share the scorer's steps."""
    if c.mix is None:
        return None
    spec, own = spec_of(c.mix), spec_of(c.strategy)
    if not c.trains_encoder or "trained" in (spec.aggregation, own.aggregation) or spec.features or own.features:
        raise ValueError(f"mix {c.mix!r} with {c.strategy!r}: only strategies whose scorer alone is trained mix "
                         "(keyb2, keyb2-blocks, maxp, firstp)")
    if c.mix == c.strategy:
        raise ValueError(f"mix {c.mix!r} is the strategy trained already")
    return spec


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
