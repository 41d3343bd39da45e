"""The CPU half of a rerank request, stage by stage, with no I/O:

    encode (tokenize) -> segment -> select (keyb2) -> assemble -> model inputs

One plan, split only where serving must await the model:

    Pipeline.cut(...)      tokenize, segment, CPU selectors   -> Cut
    (the cross selector's block logits, scored by the caller)
    Pipeline.finish(cut)   assemble, frame with the template   -> Plan

``Pipeline.plan`` is the two run back to back (with a synchronous
``cross_scorer`` for the cross selector). ``Reranker.arank`` runs ``cut`` and
``finish`` on a worker thread and awaits the scorer between them; ``keyrank
bench`` and ``keyrank finetune`` call ``plan``. There is no other code path
that builds model inputs, so what is trained, measured and served cannot
drift apart. Scoring and aggregation come after, in reranker.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from keyrank import metrics
from keyrank.config import Settings
from keyrank.doc_cache import DocumentCache, namespace
from keyrank.errors import InvalidRequest, ModelAssetsMissing
from keyrank.scoring import ModelInputs
from keyrank.segment import Spans, blocks, per_document, token_break_costs, windows
from keyrank.select import REGISTRY as SELECTOR_REGISTRY
from keyrank.select import SELECTORS, get_selector
from keyrank.select.bm25 import IdfTable, term_mask
from keyrank.strategies import REGISTRY, STRATEGIES, Passage, StrategySpec
from keyrank.strategies.firstp import first_passage
from keyrank.strategies.keyb2 import keyb2_passages
from keyrank.strategies.windows import window_passages
from keyrank.template import InputTemplate
from keyrank.tokenize import Encoded, TextTokenizer


@dataclass(frozen=True, slots=True)
class RerankOptions:
    """How one request wants to be ranked; ``None`` = the service's default."""

    strategy: str | None = None
    """A registry name (strategies.REGISTRY)."""
    selector: str | None = None
    """Block selector for strategies that select (keyb2)."""
    top_n: int | None = None
    """Return only the best ``top_n`` documents."""
    max_tokens_per_doc: int | None = None
    """Read at most this many tokens of each document (the cut is reported)."""
    max_windows_per_doc: int | None = None
    """Windowed strategies: score at most this many windows per document (Cohere's max_chunks_per_doc);
    None = the service's cap. The cut is reported."""
    timeout_s: float | None = None
    """Deadline of this request in seconds."""


class StageTimer:
    """Per-stage wall time of one request, mirrored into the stage histogram (metrics.STAGE_SECONDS)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        """Milliseconds per stage run so far (a stage run twice adds up)."""
        self._t0 = time.perf_counter()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - started
            self.ms[name] = self.ms.get(name, 0.0) + seconds * 1000.0
            metrics.STAGE_SECONDS.labels(name).observe(seconds)

    def total(self) -> dict[str, float]:
        """The stages this request ran (a stage it skipped is absent, not 0), and the total."""
        seconds = time.perf_counter() - self._t0
        metrics.STAGE_SECONDS.labels("total").observe(seconds)
        return {**{k: round(v, 3) for k, v in self.ms.items()}, "total": round(seconds * 1000.0, 3)}


@dataclass(slots=True)
class Cut:
    """A request after tokenize, segment and (CPU) select: the first half of its plan."""

    query: Encoded
    """The query's tokens (after the query cap)."""
    docs: list[Encoded]
    """Every document's tokens (after ``max_tokens_per_doc``)."""
    spec: StrategySpec
    """The strategy's registry row."""
    selector: str | None
    """The block selector (strategies that select), else None."""
    budget: int
    """Document tokens that fit next to the query in one sequence."""
    pieces: list[Spans]
    """Blocks or windows of each document (empty for firstp)."""
    block_scores: list[np.ndarray]
    """Selector score of every block of every document (empty until the cross selector's logits arrive)."""
    selector_inputs: ModelInputs
    """The cross selector's sequences (each block alone with the query), which the caller scores."""

    @property
    def awaits_model(self) -> bool:
        """The cross selector's block logits must be scored before ``Pipeline.finish``."""
        return len(self.selector_inputs) > 0 and not self.block_scores


@dataclass(slots=True)
class Plan(Cut):
    """A finished ``Cut``: what to score for one request, and how the scores map back."""

    passages: list[Passage] = field(default_factory=list)
    """What each sequence holds of its document, grouped by document."""
    inputs: ModelInputs = field(default_factory=lambda: ModelInputs([], []))
    """The sequences, framed by the model's template."""

    @property
    def doc_of(self) -> np.ndarray:
        """int64 [S] document of each sequence."""
        return np.fromiter((p.doc for p in self.passages), dtype=np.int64, count=len(self.passages))

    @property
    def coverage(self) -> list[tuple[int, int]]:
        """Per document: (tokens the model read, tokens the document has). Read = the union of its
        passages' token ranges (keyb2: the selected blocks; windowed: every window scored; firstp: the
        prefix); has = the whole text, before ``max_tokens_per_doc``."""
        read = [np.zeros(len(d), dtype=bool) for d in self.docs]
        for p in self.passages:
            for a, b in zip(p.starts.tolist(), p.ends.tolist()):
                read[p.doc][a:b] = True
        return [(int(mask.sum()), d.total_tokens) for mask, d in zip(read, self.docs)]

    @property
    def truncated(self) -> list[bool]:
        """Per document: the model did not read all of it (a prefix, chosen blocks, capped windows, a
        ``max_tokens_per_doc`` cut)."""
        return [seen < total for seen, total in self.coverage]


class Pipeline:
    """Tokenizer, template and the stages' parameters of one prepared model."""

    def __init__(self, tokenizer: TextTokenizer, template: InputTemplate, settings: Settings, *,
                 gateway_dir: Path | None = None, manifest: dict | None = None):
        self.manifest = manifest or {}
        """What ``keyrank prepare`` wrote about the models (source, fingerprints, template); read once."""
        self.tokenizer = tokenizer
        """The cross-encoder's tokenizer (special tokens in text stay text)."""
        self.template = template
        """How the model frames query and document."""
        self.settings = settings
        """Stage parameters (query cap, block size, window stride, BM25, ...)."""
        self.gateway_dir = gateway_dir
        """Where the bi-encoder and trained parts live (None: no dense selector)."""
        self.break_costs = token_break_costs(tokenizer)
        is_term = term_mask(tokenizer)
        is_term[[i for i in template.special_ids if i < is_term.shape[0]]] = False
        self.is_term = is_term
        self.idf = IdfTable.from_json(settings.bm25_idf_table, tokenizer) if settings.bm25_idf_table else None
        self.documents = DocumentCache(settings.document_cache_bytes, namespace(tokenizer, template, settings))
        """Tokens, blocks and BM25 terms of documents seen before, by content hash (doc_cache.py)."""
        self._dense: Any = None
        self._dense_lock = threading.Lock()
        # Compile (or load from numba's cache) the segmentation DP now, not in the first request.
        blocks(tokenizer.encode_documents(["Warm up. The first request should not pay for this."])[0], self.break_costs)

    @classmethod
    def from_model_dir(cls, settings: Settings) -> Pipeline:
        """The pipeline of ``settings.model_dir`` (the output of ``keyrank prepare``)."""
        gateway = settings.gateway_dir
        manifest_path = gateway / "manifest.json"
        if not manifest_path.exists():
            raise ModelAssetsMissing(
                f"{manifest_path.resolve()} not found: point KEYRANK_MODEL_DIR at the folder `keyrank prepare --out` "
                f"wrote, or run `keyrank prepare --model <hub id or folder> --out {settings.model_dir}`"
            )
        manifest = json.loads(manifest_path.read_text())
        template = load_template(manifest, gateway)
        tokenizer = TextTokenizer.from_file(gateway / "tokenizer.json", text_lead=template.text_lead, special_ids=template.special_ids)
        return cls(tokenizer, template, settings, gateway_dir=gateway, manifest=manifest)

    # --- 1. encode -------------------------------------------------------------------------
    def encode(self, query: str, documents: Sequence[str], max_tokens: int | None = None) -> tuple[Encoded, list[Encoded]]:
        """Query (cut to the query cap) and documents, tokenized once with offsets."""
        query_enc = self.tokenizer.encode_query(query, self.settings.query_max_tokens)
        return query_enc, self.documents.encode(documents, max_tokens, self.tokenizer.encode_documents)

    def budget(self, query: Encoded) -> int:
        """Document tokens that fit next to the query in one model input."""
        return self.template.document_budget(len(query), self.settings.max_sequence_length)

    # --- 2. segment ------------------------------------------------------------------------
    def segment(self, docs: list[Encoded], spec: StrategySpec, budget: int, max_windows: int | None = None) -> list[Spans]:
        """Blocks (keyb2) or windows (windowed strategies, at most ``max_windows`` or the service's cap
        per document) of every document; nothing for firstp."""
        s = self.settings
        if spec.cut == "blocks":
            return self.documents.blocks(docs, lambda d: blocks(d, self.break_costs, s.block_max_tokens, s.block_cost))
        if spec.windowed:
            stride = budget if spec.cut == "disjoint" else (s.window_stride or max(1, budget // 2))
            cap = min(max_windows, s.max_windows_per_doc) if max_windows else s.max_windows_per_doc
            return [windows(len(d), budget, stride, cap) for d in docs]
        return []

    # --- 3. select ------------------------------------------------------------------------
    def block_scores(self, selector: str, query_text: str, query: Encoded, docs: list[Encoded], pieces: list[Spans]) -> list[np.ndarray]:
        """Scores of every block of every document by a gateway selector (select.REGISTRY's ``module``)."""
        return get_selector(selector).scorer()(self, query_text, query, docs, pieces)

    def cross_selector_inputs(self, query: Encoded, docs: list[Encoded], pieces: list[Spans]) -> ModelInputs:
        """Each block alone with the query: what the cross selector scores before assembly."""
        return self.inputs(query, docs, [p for i, sp in enumerate(pieces) for p in window_passages(i, sp)])

    def dense(self):
        """The bi-encoder selector, loaded on first use (an ONNX Runtime session)."""
        with self._dense_lock:
            if self._dense is None:
                from keyrank.select.dense import DenseSelector

                if self.gateway_dir is None or not (self.gateway_dir / "bi_encoder").is_dir():
                    raise InvalidRequest("the dense selector's bi-encoder was not prepared (keyrank prepare without --no-bi-encoder)", field="selector")
                s = self.settings
                self._dense = DenseSelector(
                    self.gateway_dir / "bi_encoder", cache_size=s.dense_cache_size, batch_size=s.dense_batch_size, threads=s.dense_threads
                )
            return self._dense

    # --- 4. assemble ----------------------------------------------------------------------
    def assemble(self, spec: StrategySpec, docs: list[Encoded], pieces: list[Spans], block_scores: list[np.ndarray], budget: int,
                 selector: str | None) -> list[Passage]:
        """The passages each document contributes, grouped by document."""
        if spec.cut == "blocks":  # the budget rule and selection rules are settings (strategies/keyb2.py)
            return keyb2_passages(docs, pieces, block_scores, budget, self.settings, selector=selector)
        if spec.windowed:
            return [p for i in range(len(docs)) for p in window_passages(i, pieces[i])]
        return [first_passage(i, len(d), budget) for i, d in enumerate(docs)]

    def inputs(self, query: Encoded, docs: list[Encoded], passages: list[Passage]) -> ModelInputs:
        """The model's template around the query and each passage's token ranges."""
        built = [self.template.build(query.ids, docs[p.doc].ids, p.starts, p.ends) for p in passages]
        return ModelInputs([ids for ids, _ in built], [types for _, types in built])

    # --- all of it -----------------------------------------------------------------------------
    def resolve(self, options: RerankOptions) -> tuple[StrategySpec, str | None]:
        """The options' strategy row and selector, defaults filled in, unknown names refused."""
        name = options.strategy or self.settings.default_strategy
        if name not in REGISTRY:
            raise InvalidRequest(f"unknown strategy {name!r}; expected one of {', '.join(STRATEGIES)}", field="strategy")
        spec = REGISTRY[name]
        selector = (options.selector or self.settings.default_selector) if spec.needs_selector else None
        if selector is not None and selector not in SELECTORS:
            raise InvalidRequest(f"unknown selector {selector!r}; expected one of {', '.join(SELECTORS)}", field="selector")
        missing = [p for p in spec.trained_parts if self.gateway_dir is None or not (self.gateway_dir / p).exists()]
        if missing:
            raise InvalidRequest(
                f"strategy {name!r} needs its trained part ({', '.join(missing)}); train it with "
                f"`keyrank finetune --strategy {name}` and prepare the model again", field="strategy"
            )
        return spec, selector

    def cut(self, query: str, documents: Sequence[str], options: RerankOptions = RerankOptions(),
            timer: StageTimer | None = None) -> Cut:
        """The plan's first half: tokenize, segment, and score blocks with a CPU selector. For the cross
        selector, ``Cut.selector_inputs`` holds what the model must score before ``finish``."""
        timer = timer or StageTimer()
        spec, selector = self.resolve(options)
        with timer.stage("tokenize"):
            query_enc, docs = self.encode(query, documents, options.max_tokens_per_doc)
        budget = self.budget(query_enc)
        with timer.stage("segment"):
            pieces = self.segment(docs, spec, budget, options.max_windows_per_doc)
        scores: list[np.ndarray] = []
        selector_inputs = ModelInputs([], [])
        if spec.needs_selector:
            with timer.stage("select"):
                if SELECTOR_REGISTRY[selector].scored_by == "model":  # each block alone first (KeyB2's costliest selector)
                    selector_inputs = self.cross_selector_inputs(query_enc, docs, pieces)
                    if not len(selector_inputs):  # no document has a block: nothing to await
                        scores = [np.zeros(0) for _ in pieces]
                else:
                    scores = self.block_scores(selector, query, query_enc, docs, pieces)
        return Cut(query_enc, docs, spec, selector, budget, pieces, scores, selector_inputs)

    def finish(self, cut: Cut, selector_logits: np.ndarray | None = None, timer: StageTimer | None = None) -> Plan:
        """The plan's second half: assemble each document's passages and frame them with the template.
        ``selector_logits``: the cross selector's scores of ``cut.selector_inputs``, in their order."""
        timer = timer or StageTimer()
        if cut.awaits_model:
            if selector_logits is None:
                raise ValueError("the cross selector scores blocks with the model: pass its logits of cut.selector_inputs")
            logits = np.asarray(selector_logits, np.float64)
            cut.block_scores = per_document(logits, cut.pieces)
        with timer.stage("assemble"):
            passages = self.assemble(cut.spec, cut.docs, cut.pieces, cut.block_scores, cut.budget, cut.selector)
            inputs = self.inputs(cut.query, cut.docs, passages)
        return Plan(cut.query, cut.docs, cut.spec, cut.selector, cut.budget, cut.pieces, cut.block_scores, cut.selector_inputs,
                    passages, inputs)

    def plan(
        self,
        query: str,
        documents: Sequence[str],
        options: RerankOptions = RerankOptions(),
        *,
        cross_scorer: Callable[[ModelInputs], np.ndarray] | None = None,
        timer: StageTimer | None = None,
    ) -> Plan:
        """Every CPU stage in order: ``cut`` then ``finish``. The cross selector needs ``cross_scorer``
        (block logits of ``Cut.selector_inputs``), which a synchronous caller supplies."""
        timer = timer or StageTimer()
        cut = self.cut(query, documents, options, timer)
        logits = None
        if cut.awaits_model:
            if cross_scorer is None:
                raise ValueError("the cross selector scores blocks with the model: pass cross_scorer")
            with timer.stage("select"):
                logits = cross_scorer(cut.selector_inputs)
        return self.finish(cut, logits, timer)


def load_template(manifest: dict, gateway: Path) -> InputTemplate:
    """The manifest's template; a manifest from before templates existed was always BERT-style."""
    entry = manifest["cross_encoder"]
    if "template" in entry:
        return InputTemplate.from_json(entry["template"])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(gateway / "tokenizer.json"))
    ids = [tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")]
    if None in ids:
        raise ModelAssetsMissing(f"{gateway}: manifest has no input template; run `keyrank prepare --force` again")
    return InputTemplate.bert(*ids, max_length=int(entry.get("max_length", 512)))
