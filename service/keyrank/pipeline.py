"""The CPU half of a rerank request, stage by stage, with no I/O:

    encode (tokenize) -> segment -> select (keyb2) -> assemble -> model inputs

One plan, split only where serving must await the model:

    Pipeline.resolve(...)       the request's options, decided once -> Resolved
    Pipeline.start(...)         tokenize, segment, CPU selectors   -> Segmented
    (the cross selector's block logits, scored by the caller)
    Pipeline.finish(segmented)  assemble, frame with the template   -> Plan

``Pipeline.plan`` is the two run back to back (with a synchronous
``cross_scorer`` for the cross selector). How a document is cut and assembled
is its strategy's cut object (strategies/cuts.py); how blocks are scored is the
block selector this pipeline built (select/). ``Reranker.arank`` runs ``start`` and
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

import numpy as np

from keyrank import metrics
from keyrank.config import Settings
from keyrank.doc_cache import DocumentCache, namespace
from keyrank.errors import ModelAssetsMissing
from keyrank.resolved import RerankOptions, Resolved, check_defaults, resolve
from keyrank.scoring import ModelInputs
from keyrank.segment import Spans, best_pieces, blocks, token_break_costs
from keyrank.select import REGISTRY as SELECTOR_REGISTRY
from keyrank.select import BlockSelector, ModelRoundTrip, SelectorContext
from keyrank.select.bm25 import general_table, term_mask
from keyrank.strategies import Passage, StrategySpec
from keyrank.strategies.cuts import UNCAPPED, CutContext
from keyrank.template import InputTemplate
from keyrank.tokenize import Encoded, TextTokenizer, word_cache_pays

ANCHOR_MIN_IDF = 3.5
"""A query term is rare (``Pipeline.anchors``) from this general-table IDF on (at most one block in 12 holds
it): "why" (4.0), "does" (4.4) and every content word are; "what" (3.0), "who" (3.1), "how" (3.3) and the
function words are not. Chosen on dev with ``keyb2_blocks_lead`` (docs/EXPERIMENTS.md, 2026-11-27)."""

__all__ = ["Pipeline", "Plan", "RerankOptions", "Resolved", "StageTimer", "check_served_defaults", "load_template"]


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
class Segmented:
    """A request after tokenize, segment and (CPU) select: the first half of its plan (``Pipeline.start``)."""

    query: Encoded
    """The query's tokens (after the query cap)."""
    docs: list[Encoded]
    """Every document's tokens (after ``max_tokens_per_doc``)."""
    resolved: Resolved
    """The request's options, decided (strategy and selector rows, caps)."""
    budget: int
    """Document tokens that fit next to the query in one sequence."""
    pieces: list[Spans]
    """Blocks or windows of each document (empty for firstp)."""
    block_scores: list[np.ndarray]
    """Selector score of every block of every document (empty until a round trip's logits arrive)."""
    round_trip: ModelRoundTrip | None
    """A selector that the model scores (cross): the sequences the caller scores before ``Pipeline.finish``."""

    @property
    def spec(self) -> StrategySpec:
        """The strategy's registry row."""
        return self.resolved.spec

    @property
    def selector_inputs(self) -> ModelInputs:
        """The sequences the selector had the model score (none but the cross selector's)."""
        return self.round_trip.inputs if self.round_trip is not None else ModelInputs([], [])

    @property
    def awaits_model(self) -> bool:
        """The selector's round trip must be scored before ``Pipeline.finish``."""
        return self.round_trip is not None and not self.block_scores


@dataclass(slots=True)
class Plan(Segmented):
    """A finished ``Segmented``: what to score for one request, and how the scores map back."""

    passages: list[Passage] = field(default_factory=list)
    """What each sequence holds of its document, grouped by document."""
    inputs: ModelInputs = field(default_factory=lambda: ModelInputs([], []))
    """The sequences, framed by the model's template."""
    _coverage: list[tuple[int, int]] | None = field(default=None, repr=False, compare=False)

    @property
    def doc_of(self) -> np.ndarray:
        """int64 [S] document of each sequence."""
        return np.fromiter((p.doc for p in self.passages), dtype=np.int64, count=len(self.passages))

    @property
    def coverage(self) -> list[tuple[int, int]]:
        """Per document: (tokens the model read, tokens the document has). Read = the union of its
        passages' token ranges (keyb2: the selected blocks; windowed: every window scored; firstp: the
        prefix); has = the whole text, before ``max_tokens_per_doc``."""
        if self._coverage is None:  # worked out once: the answer, its usage and the metrics all read it
            read = [np.zeros(len(d), dtype=bool) for d in self.docs]
            for p in self.passages:
                for a, b in zip(p.starts.tolist(), p.ends.tolist()):
                    read[p.doc][a:b] = True
            self._coverage = [(int(mask.sum()), d.total_tokens) for mask, d in zip(read, self.docs)]
        return self._coverage

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
        self.documents = DocumentCache(settings.document_cache_bytes, namespace(tokenizer, template, settings))
        """Tokens, blocks and BM25 terms of documents seen before, by content hash (doc_cache.py)."""
        self.break_costs = token_break_costs(tokenizer)
        """float64 [vocab] cost of a block break after each token (segment.py)."""
        self.cuts = CutContext(settings, self.break_costs, self.documents)
        """What the strategies' cuts read (strategies/cuts.py)."""
        is_term = term_mask(tokenizer)
        is_term[[i for i in template.special_ids if i < is_term.shape[0]]] = False
        self.is_term = is_term
        """bool [vocab]: which token ids are BM25 terms (what ``keyrank idf`` counts, too)."""
        self._selector_context = SelectorContext(settings, tokenizer, template, is_term, self.documents, gateway_dir,
                                                 self.block_selector)
        self._selectors: dict[str, BlockSelector] = {}
        self._selectors_lock = threading.RLock()  # hybrid builds bm25 and dense while building itself
        # Build the selectors that load nothing now (BM25's IDF table), not in the first request; and compile
        # (or load from numba's cache) the segmentation DP.
        for spec in SELECTOR_REGISTRY.values():
            if not spec.bi_encoder:
                self.block_selector(spec.name)
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
        choice = settings.tokenize_word_cache
        word_cache = word_cache_pays(settings.workers) if choice == "auto" else choice == "on"
        tokenizer = TextTokenizer.from_file(gateway / "tokenizer.json", text_lead=template.text_lead, special_ids=template.special_ids,
                                            word_cache=word_cache)
        return cls(tokenizer, template, settings, gateway_dir=gateway, manifest=manifest)

    # --- 1. encode -------------------------------------------------------------------------
    def encode(self, query: str, documents: Sequence[str], max_tokens: int | None = None) -> tuple[Encoded, list[Encoded]]:
        """Query (cut to the query cap) and documents, tokenized once with offsets."""
        query_enc = self.tokenizer.encode_query(query, self.settings.query_max_tokens)
        return query_enc, self.documents.encode(documents, max_tokens, self.tokenizer.encode_documents)

    # --- 2. segment ------------------------------------------------------------------------
    def segment(self, docs: list[Encoded], resolved: Resolved, budget: int) -> list[Spans]:
        """The pieces of every document, as the strategy's cut makes them (blocks, windows, none): every window when
        the request's window picker keeps the best past the cap (``pick_windows``), else the first ``max_windows``."""
        cap = resolved.max_windows if resolved.window_picker is None else UNCAPPED
        return resolved.spec.cut.segment(docs, budget, cap, self.cuts)

    def pick_windows(self, query: str, query_enc: Encoded, docs: list[Encoded], pieces: list[Spans],
                     resolved: Resolved) -> list[Spans]:
        """Past the cap, each document's best ``max_windows`` windows by the request's window picker (BM25), in
        document order (``segment.best_pieces``)."""
        scores = self.block_selector(resolved.window_picker.name).score(query, query_enc, docs, pieces)
        return [best_pieces(sp, sc, resolved.max_windows) for sp, sc in zip(pieces, scores)]

    # --- 3. select ------------------------------------------------------------------------
    def block_selector(self, name: str) -> BlockSelector:
        """The block selector ``name``, built on first use and kept (it owns its IDF table, its encoder)."""
        with self._selectors_lock:
            if name not in self._selectors:
                self._selectors[name] = SELECTOR_REGISTRY[name].build(self._selector_context)
            return self._selectors[name]

    # --- 4. assemble ----------------------------------------------------------------------
    def assemble(self, segmented: Segmented) -> list[Passage]:
        """The passages each document contributes, grouped by document (the strategy's cut)."""
        resolved, cut = segmented.resolved, segmented.spec.cut
        terms = {"anchors": self.anchors(segmented.query)} if cut.reads_query_terms else {}
        return cut.assemble(segmented.docs, segmented.pieces, segmented.block_scores, segmented.budget, resolved.settings,
                            resolved.selector, **terms)

    def anchors(self, query: Encoded) -> np.ndarray:
        """The query's rare terms: its BM25 term ids whose IDF in the general table (select/idf.py) is at least
        ``ANCHOR_MIN_IDF``, so question words and other common pieces do not count (a term the table lacks
        counts as rare)."""
        return rare_terms(query.ids, self.is_term, self.tokenizer)

    def inputs(self, query: Encoded, docs: list[Encoded], passages: list[Passage]) -> ModelInputs:
        """The model's template around the query and each passage's token ranges."""
        return ModelInputs(*self.template.build_all(query.ids, [(docs[p.doc].ids, p.starts, p.ends) for p in passages]))

    # --- all of it -----------------------------------------------------------------------------
    def resolve(self, options: RerankOptions | Resolved) -> Resolved:
        """The options decided against this model and its settings (resolved.py); a ``Resolved`` as it is."""
        if isinstance(options, Resolved):
            return options
        return resolve(options, self.settings, self.template, self.gateway_dir)

    def start(self, query: str, documents: Sequence[str], options: RerankOptions | Resolved = RerankOptions(),
              timer: StageTimer | None = None) -> Segmented:
        """The plan's first half: tokenize, segment, and score blocks with the request's selector. For a selector the
        model scores (cross), ``Segmented.round_trip`` holds what the model must score before ``finish``."""
        timer = timer or StageTimer()
        resolved = self.resolve(options)
        with timer.stage("tokenize"):
            query_enc, docs = self.encode(query, documents, resolved.max_tokens_per_doc)
        budget = resolved.budget(len(query_enc))
        with timer.stage("segment"):
            pieces = self.segment(docs, resolved, budget)
        if resolved.window_picker is not None and any(len(sp) > resolved.max_windows for sp in pieces):
            with timer.stage("select"):
                pieces = self.pick_windows(query, query_enc, docs, pieces, resolved)
        scores: list[np.ndarray] | ModelRoundTrip = []
        if resolved.selector is not None:
            with timer.stage("select"):
                scores = self.block_selector(resolved.selector.name).score(query, query_enc, docs, pieces)
        if isinstance(scores, ModelRoundTrip):
            return Segmented(query_enc, docs, resolved, budget, pieces, [], scores)
        return Segmented(query_enc, docs, resolved, budget, pieces, scores, None)

    def finish(self, segmented: Segmented, selector_logits: np.ndarray | None = None, timer: StageTimer | None = None) -> Plan:
        """The plan's second half: assemble each document's passages and frame them with the template.
        ``selector_logits``: the model's scores of ``segmented.selector_inputs`` (its round trip), in their order."""
        timer = timer or StageTimer()
        if segmented.awaits_model:
            if selector_logits is None:
                raise ValueError("the selector scores blocks with the model: pass its logits of segmented.selector_inputs")
            segmented.block_scores = segmented.round_trip.scores(selector_logits)
        with timer.stage("assemble"):
            passages = self.assemble(segmented)
            inputs = self.inputs(segmented.query, segmented.docs, passages)
        return Plan(segmented.query, segmented.docs, segmented.resolved, segmented.budget, segmented.pieces,
                    segmented.block_scores, segmented.round_trip, passages, inputs)

    def plan(
        self,
        query: str,
        documents: Sequence[str],
        options: RerankOptions | Resolved = RerankOptions(),
        *,
        cross_scorer: Callable[[ModelInputs], np.ndarray] | None = None,
        timer: StageTimer | None = None,
    ) -> Plan:
        """Every CPU stage in order: ``start`` then ``finish``. A selector the model scores (cross) needs
        ``cross_scorer`` (the logits of ``Segmented.selector_inputs``), which a synchronous caller supplies."""
        timer = timer or StageTimer()
        segmented = self.start(query, documents, options, timer)
        logits = None
        if segmented.awaits_model:
            if cross_scorer is None:
                raise ValueError("the selector scores blocks with the model: pass cross_scorer")
            with timer.stage("select"):
                logits = cross_scorer(segmented.selector_inputs)
        return self.finish(segmented, logits, timer)


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


def check_served_defaults(settings: Settings) -> None:
    """``check_defaults`` for every model ``settings`` serves (KEYRANK_MODELS' folders, else ``model_dir``), read from
    its manifest alone, so `keyrank serve` refuses a default a model cannot serve before it starts anything; a folder
    that was not prepared is named by whatever loads it."""
    for name, folder in (settings.served_models() or {"": settings.model_dir}).items():
        each = settings.for_model(name, folder) if name else settings
        manifest = each.gateway_dir / "manifest.json"
        if manifest.is_file():
            template = load_template(json.loads(manifest.read_text()), each.gateway_dir)
            check_defaults(each, template, each.gateway_dir, f"the model in {folder}")


def rare_terms(ids: np.ndarray, is_term: np.ndarray, tokenizer: TextTokenizer) -> np.ndarray:
    """``Pipeline.anchors`` for any token ids: the unique ones ``is_term`` keeps whose general-table IDF is at
    least ``ANCHOR_MIN_IDF``."""
    terms = np.unique(ids[is_term[ids]])
    return terms[general_table(tokenizer).lookup(terms) >= ANCHOR_MIN_IDF]
