"""The CPU half of a rerank request, stage by stage, with no I/O:

    encode (tokenize) -> segment -> select (keyb2) -> assemble -> model inputs

``Pipeline.plan`` runs them all and answers a ``Plan``: what the scorer must
score and how the scores map back to documents. The server (reranker.py),
``keyrank bench`` and ``keyrank finetune`` all build their model inputs here,
so what is trained, measured and served cannot drift apart. Scoring and
aggregation come after, in reranker.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from keyrank.config import SELECTORS, Settings
from keyrank.doc_cache import DocumentCache, namespace
from keyrank.errors import InvalidRequest, ModelAssetsMissing
from keyrank.scoring import ModelInputs
from keyrank.segment import Spans, blocks, token_break_costs, windows
from keyrank.select.bm25 import IdfTable, bm25_scores, term_mask
from keyrank.select.hybrid import hybrid_scores
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


@dataclass(frozen=True, slots=True)
class Plan:
    """What to score for one request, and how the scores map back."""

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
    passages: list[Passage]
    """What each sequence holds of its document, grouped by document."""
    inputs: ModelInputs
    """The sequences, framed by the model's template."""

    @property
    def doc_of(self) -> np.ndarray:
        """int64 [S] document of each sequence."""
        return np.fromiter((p.doc for p in self.passages), dtype=np.int64, count=len(self.passages))

    @property
    def truncated(self) -> list[bool]:
        """Per document: tokens past a cap (``max_tokens_per_doc``, the window cap) were not read."""
        windowed = self.spec.windowed
        return [d.truncated or (windowed and self.pieces[i].truncated) for i, d in enumerate(self.docs)]


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
        """Scores of every block of every document by a CPU selector (bm25, dense, hybrid)."""
        counts = np.cumsum([len(sp) for sp in pieces])[:-1]
        if selector == "bm25":
            flat = self.documents.block_terms(docs, pieces, self.is_term)
            query_terms = query.ids[self.is_term[query.ids]]
            scores = bm25_scores(query_terms, flat, k1=self.settings.bm25_k1, b=self.settings.bm25_b, idf_table=self.idf)
            return np.split(scores, counts)
        if selector == "dense":
            texts = [[d.text[slice(*d.char_span(a, b))] for a, b in zip(sp.starts, sp.ends)] for d, sp in zip(docs, pieces)]
            return self.dense().score_blocks(query_text, texts)
        if selector == "hybrid":  # reciprocal rank fusion of the lexical and the bi-encoder ranking
            lexical = self.block_scores("bm25", query_text, query, docs, pieces)
            dense = self.block_scores("dense", query_text, query, docs, pieces)
            return hybrid_scores(lexical, dense, k=self.settings.hybrid_rrf_k)
        raise ValueError(f"selector {selector!r} is not scored on the CPU")

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

    def plan(
        self,
        query: str,
        documents: Sequence[str],
        options: RerankOptions = RerankOptions(),
        *,
        cross_scorer: Callable[[ModelInputs], np.ndarray] | None = None,
    ) -> Plan:
        """Every CPU stage in order. The ``cross`` selector needs ``cross_scorer`` (block logits)."""
        spec, selector = self.resolve(options)
        query_enc, docs = self.encode(query, documents, options.max_tokens_per_doc)
        budget = self.budget(query_enc)
        pieces = self.segment(docs, spec, budget, options.max_windows_per_doc)
        scores: list[np.ndarray] = []
        if spec.needs_selector:
            if selector == "cross":
                if cross_scorer is None:
                    raise ValueError("the cross selector scores blocks with the model: pass cross_scorer")
                logits = np.asarray(cross_scorer(self.cross_selector_inputs(query_enc, docs, pieces)), np.float64)
                scores = np.split(logits, np.cumsum([len(sp) for sp in pieces])[:-1])
            else:
                scores = self.block_scores(selector, query, query_enc, docs, pieces)
        passages = self.assemble(spec, docs, pieces, scores, budget, selector)
        return Plan(query_enc, docs, spec, selector, budget, pieces, passages, self.inputs(query_enc, docs, passages))


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
