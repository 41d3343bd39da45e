"""The request path, stage by stage: ``Reranker.arank`` is the pipeline.

    tokenize -> segment -> select (keyb2) -> assemble -> infer (Scorer) -> aggregate

The CPU stages are pipeline.py's one plan (``start`` / ``finish``, shared with
``keyrank bench`` and ``keyrank finetune``); scoring is a ``Scorer`` (Triton, or ONNX Runtime
in-process). Usable without HTTP, as small as sentence-transformers' CrossEncoder::

    reranker = Reranker.local("models")                    # no Triton: the same CPU model in-process
    ranking = reranker.rank("query", ["doc one", "doc two"])

The HTTP layer (api/) is a thin shell over ``arank``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from keyrank import metrics
from keyrank.aggregate import Aggregated, ClassifierHead, aggregate, fused_with_selector, length_calibrated
from keyrank.blank import BLANK_DOCUMENT_SCORE, is_blank, is_readable_query
from keyrank.config import Settings, get_settings
from keyrank.errors import InvalidRequest, ModelAssetsMissing
from keyrank.pipeline import Pipeline, Plan, RerankOptions, Resolved, StageTimer
from keyrank.resolved import check_defaults
from keyrank.results import Evidence, RankedDocument, Ranking, Usage
from keyrank.scoring import Scorer
from keyrank.scoring.buckets import long_widths
from keyrank.strategies import REGISTRY, Passage, StrategySpec
from keyrank.template import InputTemplate
from keyrank.tokenize import Encoded

log = logging.getLogger(__name__)

__all__ = ["Evidence", "RankedDocument", "Ranking", "RerankOptions", "Reranker", "Usage"]



class Reranker:
    """Ranks documents for a query: the pipeline's plan, scored by a ``Scorer``, aggregated."""

    def __init__(self, settings: Settings | None = None, *, scorer: Scorer | None = None,
                 pipeline: Pipeline | None = None, **overrides: Any):
        settings = settings or get_settings()
        self.settings = settings.with_overrides(**overrides)
        self.pipeline = pipeline or Pipeline.from_model_dir(self.settings)
        """The CPU stages and the model's template."""
        self.template = self.pipeline.template
        self.tokenizer = self.pipeline.tokenizer
        gateway = self.settings.gateway_dir
        check_defaults(self.settings, self.template, gateway, f"the model in {self.settings.model_dir}")
        source = str(self.pipeline.manifest["cross_encoder"]["source"])
        # A local checkpoint is named by its folder: the server's paths are not the caller's business.
        self.model_name = getattr(self.settings, "model_name", None) or (Path(source).name if Path(source).exists() or Path(source).is_absolute() else source)
        with np.load(gateway / "classifier_head.npz") as head:
            self.head = ClassifierHead(head["weight"].astype(np.float64), head["bias"].astype(np.float64))
        self._trained: dict[str, Any] = {}
        self._feature_scorers: dict[str, Scorer] = {}
        if scorer is None:
            if not self.settings.triton_url:
                raise ValueError("no Triton to score on: set triton_url, or use Reranker.embedded() or Reranker.local()")
            scorer = self.triton_scorer(self.settings, self.template)
        self.scorer: Scorer = scorer
        """Where sequences are scored."""
        self.graphs: tuple[str, ...] = tuple(
            name for name, spec in REGISTRY.items()
            if spec.features and hasattr(scorer, "with_graph") and not spec.missing_parts(gateway))
        """The interaction strategies (CEDR, Model 1) installed when it started: ``ready`` waits on each one's graph."""
        self._embedded: Any = None
        self._loop: _LoopThread | None = None

    @staticmethod
    def triton_scorer(settings: Settings, template: InputTemplate) -> Scorer:
        from keyrank.scoring.triton import TritonScorer

        embedded = settings.triton_server_id is not None  # keyrank serve's or Reranker.embedded()'s own Triton
        return TritonScorer(
            settings.triton_url, model=settings.triton_model, pad_id=template.pad_id, buckets=settings.length_buckets,
            long_buckets=long_buckets(settings, template),
            batch_size=settings.triton_batch_size, max_in_flight=settings.triton_max_in_flight,
            probe_timeout_s=settings.triton_connect_timeout_s, server_id=settings.triton_server_id,
            max_shapes=settings.length_bucket_shapes, multiple=settings.length_bucket_multiple,
            small_sequences=settings.small_request_sequences,
            # The embedded CPU Triton runs one batch at a time: a small request behind a heavy one waits for
            # the batch running now, so heavy requests send short batches there, sized when their slot is
            # granted, two in flight (docs/RELIABILITY.md, "Fairness").
            heavy_batch_size=settings.heavy_batch_size or (None if embedded else settings.triton_batch_size),
            heavy_in_flight=settings.heavy_in_flight or (2 if embedded else settings.triton_max_in_flight),
            heavy_batch_s=settings.heavy_batch_ms / 1000, heavy_yield_s=settings.heavy_yield_s,
            channel={"balancing": settings.triton_balancing, "keepalive_s": settings.triton_keepalive_s,
                     "keepalive_timeout_s": settings.triton_keepalive_timeout_s},
        )

    # --- the pipeline -------------------------------------------------------------
    async def arank(self, query: str, documents: Sequence[str], options: RerankOptions | Resolved | None = None) -> Ranking:
        """Rank ``documents`` for ``query``; raises InvalidRequest or ScoringUnavailable.

        ``options`` are decided once (``Pipeline.resolve``; a caller that already resolved them, as the HTTP
        layer does for admission, passes the ``Resolved``). The CPU work is ``Pipeline.start`` /
        ``Pipeline.finish`` (the one plan ``keyrank finetune`` and ``keyrank bench`` call too) and the fold,
        each on a worker thread; this coroutine only awaits the scorer: once for the cross selector's blocks
        (keyb2/cross), once for the plan's sequences.

        Blank documents (nothing to read, keyrank/blank.py) are neither tokenized nor scored: they rank after
        every other, in request order, with ``BLANK_DOCUMENT_SCORE`` and no evidence, as on every route."""
        _check(query, documents)
        resolved = self.pipeline.resolve(options or RerankOptions())  # refused before any work
        blank = [is_blank(d) for d in documents]
        readable = [i for i, flag in enumerate(blank) if not flag]
        if not readable:
            ranking = Ranking(self.model_name, resolved.strategy, resolved.selector_name, [], Usage(0, 0, 0, 0, 0),
                              {"tokenize": 0.0, "segment": 0.0, "infer": 0.0, "aggregate": 0.0, "total": 0.0})
        elif len(readable) == len(documents):
            ranking = await self._rank_readable(query, documents, resolved)
        else:
            ranking = await self._rank_readable(query, [documents[i] for i in readable], resolved)
            ranking = dataclasses.replace(ranking, results=[dataclasses.replace(r, index=readable[r.index]) for r in ranking.results])
        results = ranking.results + [RankedDocument(i, BLANK_DOCUMENT_SCORE, [], False) for i, flag in enumerate(blank) if flag]
        return dataclasses.replace(ranking, results=results[: resolved.top_n] if resolved.top_n else results)

    async def _rank_readable(self, query: str, documents: Sequence[str], resolved: Resolved) -> Ranking:
        """``arank`` of documents that all have something to read: every one ranked (``arank`` cuts ``top_n``)."""
        p = self.pipeline
        deadline = time.monotonic() + resolved.timeout_s
        timer = StageTimer()

        segmented = await asyncio.to_thread(p.start, query, documents, resolved, timer)
        spec = segmented.spec
        logits = None
        if segmented.awaits_model:
            with timer.stage("select"):
                logits = (await self.scorer.score(segmented.selector_inputs, want_pooled=False, deadline=deadline)).logits
        plan = await asyncio.to_thread(p.finish, segmented, logits, timer)

        with timer.stage("infer"):
            scores = await self.scorer_for(spec).score(plan.inputs, want_pooled=spec.needs_pooled, deadline=deadline)

        results, usage = await asyncio.to_thread(self.fold, plan, scores.logits, scores.pooled, timer)
        return Ranking(self.model_name, spec.name, resolved.selector_name, results, usage, timer.total())

    def fold(self, plan: Plan, logits: np.ndarray, pooled: np.ndarray | None, timer: StageTimer | None = None
             ) -> tuple[list[RankedDocument], Usage]:
        """The sequences' scores folded into one per document (the strategy's aggregation), ranked, with
        each document's evidence and the request's usage."""
        timer = timer or StageTimer()
        with timer.stage("aggregate"):
            spec, docs, passages = plan.spec, plan.docs, plan.passages
            bias = plan.resolved.settings.keyb2_blocks_length_bias
            if spec.aggregation == "lse" and bias:  # keyb2-blocks: a fine-tuned scorer's inputs weighed by their length
                logits = length_calibrated(logits, [len(ids) for ids in plan.inputs.ids], bias)
            folded = aggregate(spec.aggregation, plan.doc_of, logits, pooled, self.head, self._aggregator(spec))
            weight = plan.resolved.settings.keyb2_fusion_weight  # the request's settings, as resolved
            if plan.resolved.selector is not None and weight:
                fused = fused_with_selector(folded.scores, plan.block_scores, weight)
                folded = Aggregated(fused, folded.best)
            coverage, truncated = plan.coverage, plan.truncated
            results = [
                RankedDocument(i, float(folded.scores[i]), _evidence(docs[i], passages[folded.best[i]]), truncated[i], *coverage[i])
                for i in range(len(docs))
            ]
            results.sort(key=lambda r: (-r.score, r.index))
            usage = Usage(
                query_tokens=len(plan.query),
                document_tokens=sum(len(d) for d in docs),
                scored_tokens=plan.inputs.tokens + plan.selector_inputs.tokens,
                scored_sequences=len(plan.inputs) + len(plan.selector_inputs),
                truncated_documents=sum(truncated),
            )
            _observe(spec, usage, len(docs), passages, folded.best)
        return results, usage

    def scorer_for(self, spec: StrategySpec) -> Scorer:
        """Where a strategy's sequences are scored: the cross-encoder, or the strategy's interaction graph
        (CEDR, Model 1: interaction.py) on the same kind of scorer, opened once."""
        if spec.features is None:
            return self.scorer
        if spec.name not in self._feature_scorers:
            with_graph = getattr(self.scorer, "with_graph", None)
            if with_graph is None:
                raise InvalidRequest(f"strategy {spec.name!r} runs its interaction graph in the gateway's process only "
                                     f"(Reranker.local); this service scores with {type(self.scorer).__name__}", field="strategy")
            graph = self.settings.gateway_dir / spec.features
            self._feature_scorers[spec.name] = with_graph(graph, model=self.settings.graph_model(graph.stem))
        return self._feature_scorers[spec.name]

    def _aggregator(self, spec):
        """The trained aggregator of a strategy that has one (PARADE-Attn/Transformer), loaded once."""
        if not spec.trained_parts:
            return None
        if spec.name not in self._trained:
            from keyrank.aggregators import TrainedAggregator

            self._trained[spec.name] = TrainedAggregator.load(self.settings.gateway_dir / spec.trained_parts[0])
        return self._trained[spec.name]

    # --- lifecycle ------------------------------------------------------------------
    async def ready(self) -> bool:
        """The scorer's model answers, and so does the interaction graph of every strategy in ``graphs``: a
        strategy offered is served only while its graph is."""
        scorers = [self.scorer, *(self.scorer_for(REGISTRY[name]) for name in self.graphs)]
        answers = await asyncio.gather(*(scorer.ready(self.settings.triton_connect_timeout_s) for scorer in scorers))
        return all(answers)

    async def aclose(self) -> None:
        for scorer in self._feature_scorers.values():
            await scorer.close()
        await self.scorer.close()

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        strategy: str | None = None,
        selector: str | None = None,
        top_n: int | None = None,
        max_tokens_per_doc: int | None = None,
        timeout_s: float | None = None,
        max_windows_per_doc: int | None = None,
    ) -> Ranking:
        """Blocking ``arank``, for scripts and notebooks (runs on a private event loop)."""
        if self._loop is None:
            self._loop = _LoopThread()
        options = RerankOptions(strategy=strategy, selector=selector, top_n=top_n, max_tokens_per_doc=max_tokens_per_doc,
                                max_windows_per_doc=max_windows_per_doc, timeout_s=timeout_s)
        return self._loop.run(self.arank(query, documents, options))

    @classmethod
    def local(cls, model_dir: str | Path | None = None, settings: Settings | None = None, *, threads: int = 0,
              device: str = "cpu", **overrides: Any) -> Reranker:
        """A Reranker scoring in this process (ONNX Runtime or OpenVINO, as prepared): no Triton, two lines to a ranking.

        ``device="cuda"``: the fp16 graph `keyrank prepare --device cuda` wrote for ONNX Runtime's CUDA provider
        (prepare/ort_cuda.py), run through I/O binding; where it cannot run (no such graph, an onnxruntime
        without CUDA, no GPU) a warning says why and the CPU variant scores instead (``scorer.runtime`` says which)."""
        from keyrank.scoring.local import LocalScorer
        from keyrank.scoring.openvino import read_runtime

        settings = settings or get_settings()
        if model_dir is not None:
            overrides["model_dir"] = Path(model_dir)
        settings = settings.with_overrides(**overrides)
        pipeline = Pipeline.from_model_dir(settings)
        shapes = dict(pad_id=pipeline.template.pad_id, buckets=settings.length_buckets, batch_size=settings.triton_batch_size,
                      long_buckets=long_buckets(settings, pipeline.template), threads=threads,
                      max_shapes=settings.length_bucket_shapes, multiple=settings.length_bucket_multiple)
        if device == "cuda":
            from keyrank.scoring.local import cuda_scorer

            scorer, why_not = cuda_scorer(settings.embedded_repository("cuda", "onnxruntime") / settings.triton_model / "1", **shapes)
            if scorer is not None:
                return cls(settings, scorer=scorer, pipeline=pipeline)
            log.warning("Reranker.local(device='cuda'): %s; scoring on the CPU instead", why_not)
        elif device != "cpu":
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        # The file the embedded Triton serves, on the same runtime: the CPU variant `keyrank prepare` gated.
        version = settings.embedded_repository("cpu") / settings.triton_model / "1"
        scorer = LocalScorer(version / "model.onnx", runtime=read_runtime(version), **shapes)
        return cls(settings, scorer=scorer, pipeline=pipeline)

    @staticmethod
    def torch_variant(settings: Settings) -> tuple[Path, str]:
        """The PyTorch variant's folder in the prepared ``settings.model_dir`` and its weights' dtype."""
        version = settings.embedded_repository("cuda", "torch") / settings.triton_model / "1"
        if not (version / "encoder.json").exists():
            raise ModelAssetsMissing(f"{settings.model_dir} has no PyTorch variant ({version}): prepare it with `keyrank prepare --device cuda`")
        return version, json.loads((version / "encoder.json").read_text()).get("weights_dtype", "bfloat16")

    @classmethod
    def torch(cls, model_dir: str | Path | None = None, settings: Settings | None = None, *, device: str = "cuda",
              dtype: str | None = None, cuda_graphs: bool = False, **overrides: Any) -> Reranker:
        """A Reranker scoring in this process with PyTorch: the GPU variant ``keyrank prepare --device cuda``
        wrote (``triton-embedded-cuda/``), in its weights' dtype unless ``dtype`` names another."""
        from keyrank.scoring.pytorch import TorchScorer

        settings = settings or get_settings()
        if model_dir is not None:
            overrides["model_dir"] = Path(model_dir)
        settings = settings.with_overrides(**overrides)
        version, weights_dtype = cls.torch_variant(settings)
        dtype = dtype or weights_dtype
        pipeline = Pipeline.from_model_dir(settings)
        scorer = TorchScorer(
            version, pad_id=pipeline.template.pad_id, device=device, dtype=dtype, cuda_graphs=cuda_graphs,
            buckets=settings.length_buckets, batch_size=max(64, settings.triton_batch_size),
            long_buckets=long_buckets(settings, pipeline.template),
            max_shapes=settings.length_bucket_shapes, multiple=settings.length_bucket_multiple,
        )
        return cls(settings, scorer=scorer, pipeline=pipeline)

    @classmethod
    def embedded(cls, settings: Settings | None = None, **overrides: Any) -> Reranker:
        """A Reranker on its own CPU Triton (the tritonserver of the nvidia-pytriton wheel)."""
        from keyrank.modelserver.embedded import EmbeddedTriton

        settings = settings or get_settings()
        # One model: KEYRANK_MODELS is for `keyrank serve` (one Reranker per model, api/app.py).
        settings = settings.with_overrides(**{"models": None, "default_model": None, **overrides})
        triton = EmbeddedTriton(settings=settings)
        triton.start()
        try:
            triton.wait_ready(settings.embedded_ready_timeout_s)
            reranker = cls(settings, triton_url=triton.grpc_url, triton_server_id=triton.server_id)
        except BaseException:
            triton.stop()
            raise
        reranker._embedded = triton
        return reranker

    def close(self) -> None:
        """Close the client and stop an embedded Triton (idempotent)."""
        if self._loop is not None:
            self._loop.run(self.aclose())
            self._loop.stop()
            self._loop = None
        if self._embedded is not None:
            self._embedded.stop()
            self._embedded = None

    def __enter__(self) -> Reranker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check(query: str, documents: Sequence[str]) -> None:
    """The Python API's input contract (the HTTP wire types hold the same before a request gets here)."""
    if not isinstance(query, str) or not is_readable_query(query):
        raise InvalidRequest("query must be a string with a readable character (not only whitespace, control, format, "
                             "zero-width, tag, private-use or combining characters)", field="query")
    if len(documents) == 0:
        raise InvalidRequest("documents must hold at least one document", field="documents")
    if any(not isinstance(d, str) for d in documents):
        raise InvalidRequest("every document must be a string", field="documents")


def long_buckets(settings: Settings, template: InputTemplate) -> tuple[int, ...]:
    """The widths past the length buckets up to the longest input a strategy builds for this model (longp's),
    as `keyrank prepare` warmed Triton up with them (prepare/repositories.py)."""
    return long_widths(max(settings.length_buckets), settings.longest_input(template.max_length))


def _evidence(doc: Encoded, passage: Passage) -> list[Evidence]:
    return [
        Evidence(*doc.char_span(int(a), int(b)), piece=int(k))
        for a, b, k in zip(passage.starts, passage.ends, passage.pieces)
        if b > a
    ]


def _observe(spec: StrategySpec, usage: Usage, n_docs: int, passages: list[Passage], best: np.ndarray) -> None:
    metrics.REQUEST_DOCUMENTS.observe(n_docs)
    metrics.REQUEST_TOKENS.observe(usage.document_tokens)
    metrics.SCORED_TOKENS.observe(usage.scored_tokens)
    if usage.truncated_documents:
        metrics.TRUNCATED_DOCUMENTS.inc(usage.truncated_documents)
    position = metrics.EVIDENCE_BLOCK_POSITION.labels(spec.name)
    for passage in spec.cut.evidence(passages, best):
        for piece in passage.pieces:
            position.observe(int(piece))


class _LoopThread:
    """An event loop on a daemon thread: the gRPC aio client lives on one loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="keyrank-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
