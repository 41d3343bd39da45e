"""The request path, stage by stage: ``Reranker.arank`` is the pipeline.

    tokenize -> segment -> select (keyb2) -> assemble -> infer (Triton) -> aggregate

Usable without HTTP, as small as sentence-transformers' CrossEncoder::

    with Reranker.embedded() as reranker:          # starts a CPU Triton
        ranking = reranker.rank("query", ["doc one", "doc two"])

The HTTP layer (api.py) is a thin shell over ``arank``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from keyrank import metrics
from keyrank.aggregate import ClassifierHead, aggregate
from keyrank.config import SELECTORS, STRATEGIES, Settings, get_settings
from keyrank.errors import InvalidRequest, ModelAssetsMissing
from keyrank.segment import Spans, blocks, token_break_costs, windows
from keyrank.select.bm25 import IdfTable, block_terms, bm25_scores, term_mask
from keyrank.strategies import (
    AGGREGATION,
    WINDOWED,
    Passage,
    model_input,
    passage_budget,
)
from keyrank.strategies.firstp import first_passage
from keyrank.strategies.keyb2 import select_blocks
from keyrank.strategies.windows import window_passages
from keyrank.tokenize import Encoded, TextTokenizer

STAGES = ("tokenize", "segment", "select", "assemble", "infer", "aggregate")


@dataclass(frozen=True, slots=True)
class Evidence:
    """A stretch of the caller's document the score rests on."""

    start: int
    """Character offset of its first character."""
    end: int
    """Character offset one past its last character."""
    piece: int | None = None
    """Index of the block (keyb2) or window (maxp, ...) it came from."""


@dataclass(frozen=True, slots=True)
class RankedDocument:
    """One document's place in the ranking."""

    index: int
    """Position of the document in the request."""
    score: float
    """Relevance score (the cross-encoder's logit scale; higher is more relevant)."""
    evidence: list[Evidence]
    """What the score rests on (selected blocks, best window, or the first passage)."""
    truncated: bool
    """Tokens past ``max_tokens_per_doc`` or the window cap were not read."""


@dataclass(frozen=True, slots=True)
class Usage:
    """What the request cost."""

    query_tokens: int
    """Query tokens fed to the model (after the query cap)."""
    document_tokens: int
    """Document tokens read (after ``max_tokens_per_doc``)."""
    scored_tokens: int
    """Tokens sent to the cross-encoder, special tokens included, padding excluded."""
    scored_sequences: int
    """Sequences sent to the cross-encoder (the cross selector's included)."""
    truncated_documents: int
    """Documents not read to the end."""


@dataclass(frozen=True, slots=True)
class Ranking:
    """The answer to one rerank call."""

    model: str
    """The cross-encoder's source (hub id or checkpoint folder name)."""
    strategy: str
    """Strategy used."""
    selector: str | None
    """Block selector (keyb2 only)."""
    results: list[RankedDocument]
    """Documents by descending score, cut to ``top_n``."""
    usage: Usage
    """Token and sequence counts."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    """Wall time per stage and in total."""


class _Timer:
    """Per-stage wall time for one request, mirrored into the stage histogram."""

    def __init__(self) -> None:
        self.ms = {stage: 0.0 for stage in STAGES}
        self._t0 = time.perf_counter()

    def add(self, stage: str, started: float) -> None:
        seconds = time.perf_counter() - started
        self.ms[stage] += seconds * 1000.0
        metrics.STAGE_SECONDS.labels(stage).observe(seconds)

    def total(self) -> dict[str, float]:
        seconds = time.perf_counter() - self._t0
        metrics.STAGE_SECONDS.labels("total").observe(seconds)
        return {**{k: round(v, 3) for k, v in self.ms.items()}, "total": round(seconds * 1000.0, 3)}


class Reranker:
    """Ranks documents for a query with a cross-encoder on Triton."""

    def __init__(self, settings: Settings | None = None, *, scorer: Any = None, **overrides: Any):
        settings = settings or get_settings()
        self.settings = settings.with_overrides(**overrides)
        gateway = self.settings.gateway_dir
        manifest_path = gateway / "manifest.json"
        if not manifest_path.exists():
            raise ModelAssetsMissing(
                f"{manifest_path} not found: run `keyrank prepare --model <hub id or folder> --out {self.settings.model_dir}`"
            )
        self.manifest = json.loads(manifest_path.read_text())
        source = str(self.manifest["cross_encoder"]["source"])
        # A local checkpoint is named by its folder: the server's paths are not the caller's business.
        self.model_name = Path(source).name if Path(source).is_absolute() else source
        self.tokenizer = TextTokenizer.from_file(gateway / "tokenizer.json")
        with np.load(gateway / "classifier_head.npz") as head:
            self.head = ClassifierHead(head["weight"].astype(np.float64), head["bias"].astype(np.float64))
        self._break_costs = token_break_costs(self.tokenizer)
        self._is_term = term_mask(self.tokenizer)
        self._idf = IdfTable.from_json(self.settings.bm25_idf_table, self.tokenizer) if self.settings.bm25_idf_table else None
        # Compile (or load from numba's cache) the segmentation DP now, not in the first request.
        blocks(self.tokenizer.encode_documents(["Warm up. The first request should not pay for this."])[0], self._break_costs)
        self._dense: Any = None
        self._dense_lock = threading.Lock()
        if scorer is None:
            from keyrank.scoring import TritonScorer

            if not self.settings.triton_url:
                raise ValueError("no Triton to score on: set triton_url, or use Reranker.embedded()")
            scorer = TritonScorer(self.settings.triton_url, pad_id=self.tokenizer.pad_id, settings=self.settings)
        self.scorer = scorer
        self._embedded: Any = None
        self._loop: _LoopThread | None = None

    # --- the pipeline -------------------------------------------------------------
    async def arank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        strategy: str | None = None,
        selector: str | None = None,
        top_n: int | None = None,
        max_tokens_per_doc: int | None = None,
        timeout_s: float | None = None,
    ) -> Ranking:
        """Rank ``documents`` for ``query``; raises InvalidRequest or ScoringUnavailable."""
        s = self.settings
        strategy = strategy or s.default_strategy
        selector = (selector or s.default_selector) if strategy == "keyb2" else None
        self._check(query, documents, strategy, selector, top_n, max_tokens_per_doc)
        deadline = time.monotonic() + (timeout_s or s.request_timeout_s)
        timer = _Timer()

        started = time.perf_counter()
        query_enc, docs = await asyncio.to_thread(self._tokenize, query, documents, max_tokens_per_doc)
        timer.add("tokenize", started)
        budget = passage_budget(len(query_enc), s.max_sequence_length)

        started = time.perf_counter()
        pieces = await asyncio.to_thread(self._segment, docs, strategy, budget)
        timer.add("segment", started)

        block_scores: list[np.ndarray] = []
        selector_usage = (0, 0)
        if strategy == "keyb2":
            started = time.perf_counter()
            block_scores, selector_usage = await self._select(selector, query, query_enc, docs, pieces, deadline)
            timer.add("select", started)

        started = time.perf_counter()
        passages = self._assemble(strategy, docs, pieces, block_scores, budget)
        inputs = self._inputs(query_enc, docs, passages)
        timer.add("assemble", started)

        started = time.perf_counter()
        method = AGGREGATION[strategy]
        want_pooled = method.startswith("parade")
        logits, pooled = await self.scorer.score(
            [ids for ids, _ in inputs], [types for _, types in inputs], want_pooled=want_pooled, deadline=deadline
        )
        timer.add("infer", started)

        started = time.perf_counter()
        doc_of = np.fromiter((p.doc for p in passages), dtype=np.int64, count=len(passages))
        folded = aggregate(method, doc_of, logits, pooled, self.head)
        truncated = [d.truncated or (strategy in WINDOWED and pieces[i].truncated) for i, d in enumerate(docs)]
        results = [
            RankedDocument(i, float(folded.scores[i]), self._evidence(strategy, docs[i], passages[folded.best[i]]), truncated[i])
            for i in range(len(docs))
        ]
        results.sort(key=lambda r: (-r.score, r.index))
        timer.add("aggregate", started)

        scored_tokens = sum(int(ids.shape[0]) for ids, _ in inputs) + selector_usage[1]
        usage = Usage(
            query_tokens=len(query_enc),
            document_tokens=sum(len(d) for d in docs),
            scored_tokens=scored_tokens,
            scored_sequences=len(inputs) + selector_usage[0],
            truncated_documents=sum(truncated),
        )
        self._observe(strategy, usage, len(docs), passages, folded.best)
        return Ranking(self.model_name, strategy, selector, results[:top_n] if top_n else results, usage, timer.total())

    def _check(self, query, documents, strategy, selector, top_n, max_tokens_per_doc) -> None:
        if not isinstance(query, str) or not query.strip():
            raise InvalidRequest("query must be a non-empty string", field="query")
        if len(documents) == 0:
            raise InvalidRequest("documents must hold at least one document", field="documents")
        if any(not isinstance(d, str) for d in documents):
            raise InvalidRequest("every document must be a string", field="documents")
        if strategy not in STRATEGIES:
            raise InvalidRequest(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}", field="strategy")
        if selector is not None and selector not in SELECTORS:
            raise InvalidRequest(f"unknown selector {selector!r}; expected one of {', '.join(SELECTORS)}", field="selector")
        if top_n is not None and top_n < 1:
            raise InvalidRequest("top_n must be at least 1", field="top_n")
        if max_tokens_per_doc is not None and max_tokens_per_doc < 1:
            raise InvalidRequest("max_tokens_per_doc must be at least 1", field="max_tokens_per_doc")

    def _tokenize(self, query: str, documents: Sequence[str], max_tokens: int | None) -> tuple[Encoded, list[Encoded]]:
        query_enc = self.tokenizer.encode_query(query, self.settings.query_max_tokens)
        return query_enc, self.tokenizer.encode_documents(documents, max_tokens=max_tokens)

    def _segment(self, docs: list[Encoded], strategy: str, budget: int) -> list[Spans]:
        s = self.settings
        if strategy == "keyb2":
            return [blocks(d, self._break_costs, s.block_max_tokens, s.block_cost) for d in docs]
        if strategy in WINDOWED:
            stride = budget if strategy == "avgp" else (s.window_stride or max(1, budget // 2))
            return [windows(len(d), budget, stride, s.max_windows_per_doc) for d in docs]
        return []  # firstp reads a prefix: nothing to cut

    async def _select(self, selector, query, query_enc, docs, pieces, deadline) -> tuple[list[np.ndarray], tuple[int, int]]:
        """Scores of every block of every document, and the (sequences, tokens) the selector scored."""
        counts = [len(sp) for sp in pieces]
        if selector == "bm25":
            block_ids = [d.ids[a:b] for d, sp in zip(docs, pieces) for a, b in zip(sp.starts, sp.ends)]
            flat = block_terms(block_ids, self._is_term)
            query_terms = query_enc.ids[self._is_term[query_enc.ids]]
            scores = bm25_scores(query_terms, flat, k1=self.settings.bm25_k1, b=self.settings.bm25_b, idf_table=self._idf)
            return np.split(scores, np.cumsum(counts)[:-1]), (0, 0)
        if selector == "dense":
            texts = [[d.text[slice(*d.char_span(a, b))] for a, b in zip(sp.starts, sp.ends)] for d, sp in zip(docs, pieces)]
            return await asyncio.to_thread(self.dense().score_blocks, query, texts), (0, 0)
        # cross: the cross-encoder scores each block alone first (KeyB2's most expensive selector).
        inputs = self._inputs(query_enc, docs, [p for i, sp in enumerate(pieces) for p in window_passages(i, sp)])
        logits, _ = await self.scorer.score([i for i, _ in inputs], [t for _, t in inputs], want_pooled=False, deadline=deadline)
        scored = (len(inputs), sum(int(i.shape[0]) for i, _ in inputs))
        return np.split(np.asarray(logits, dtype=np.float64), np.cumsum(counts)[:-1]), scored

    def _inputs(self, query: Encoded, docs: list[Encoded], passages: list[Passage]) -> list[tuple[np.ndarray, np.ndarray]]:
        """``[CLS] q [SEP] p [SEP]`` ids and token types of every passage."""
        cls_id, sep_id = self.tokenizer.cls_id, self.tokenizer.sep_id
        return [model_input(query, docs[p.doc], p, cls_id, sep_id) for p in passages]

    def dense(self):
        """The bi-encoder selector, loaded on first use (an ONNX Runtime session)."""
        with self._dense_lock:
            if self._dense is None:
                from keyrank.select.dense import DenseSelector

                s = self.settings
                self._dense = DenseSelector(
                    s.gateway_dir / "bi_encoder", cache_size=s.dense_cache_size, batch_size=s.dense_batch_size, threads=s.dense_threads
                )
            return self._dense

    def _assemble(self, strategy, docs, pieces, block_scores, budget) -> list[Passage]:
        if strategy == "keyb2":
            doc_budget = min(self.settings.keyb2_budget_tokens, budget)
            return [select_blocks(i, pieces[i], block_scores[i], doc_budget) for i in range(len(docs))]
        if strategy in WINDOWED:
            return [p for i in range(len(docs)) for p in window_passages(i, pieces[i])]
        return [first_passage(i, len(d), budget) for i, d in enumerate(docs)]

    @staticmethod
    def _evidence(strategy: str, doc: Encoded, passage: Passage) -> list[Evidence]:
        return [
            Evidence(*doc.char_span(int(a), int(b)), piece=int(k))
            for a, b, k in zip(passage.starts, passage.ends, passage.pieces)
            if b > a
        ]

    @staticmethod
    def _observe(strategy: str, usage: Usage, n_docs: int, passages: list[Passage], best: np.ndarray) -> None:
        metrics.REQUEST_DOCUMENTS.observe(n_docs)
        metrics.REQUEST_TOKENS.observe(usage.document_tokens)
        metrics.SCORED_TOKENS.observe(usage.scored_tokens)
        if usage.truncated_documents:
            metrics.TRUNCATED_DOCUMENTS.inc(usage.truncated_documents)
        position = metrics.EVIDENCE_BLOCK_POSITION.labels(strategy)
        chosen = passages if strategy == "keyb2" else [passages[i] for i in best]
        for passage in chosen:
            for piece in passage.pieces:
                position.observe(int(piece))

    # --- lifecycle ------------------------------------------------------------------
    async def ready(self) -> bool:
        """Triton is up and the cross-encoder loaded."""
        return await self.scorer.ready(self.settings.triton_connect_timeout_s)

    async def aclose(self) -> None:
        await self.scorer.close()

    def rank(self, query: str, documents: Sequence[str], **options: Any) -> Ranking:
        """Blocking ``arank``, for scripts and notebooks (runs on a private event loop)."""
        if self._loop is None:
            self._loop = _LoopThread()
        return self._loop.run(self.arank(query, documents, **options))

    @classmethod
    def embedded(cls, settings: Settings | None = None, **overrides: Any) -> Reranker:
        """A Reranker on its own CPU Triton (the tritonserver of the nvidia-pytriton wheel)."""
        from keyrank.triton_server import EmbeddedTriton

        settings = settings or get_settings()
        settings = settings.with_overrides(**overrides)
        triton = EmbeddedTriton(settings=settings)
        triton.start()
        try:
            triton.wait_ready(settings.embedded_ready_timeout_s)
            reranker = cls(settings, triton_url=triton.grpc_url)
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
