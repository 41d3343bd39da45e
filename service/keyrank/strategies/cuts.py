"""How a strategy reads a document: one object per cut, owning its segmentation, assembly and cost.

A strategy's registry row names one of these (``StrategySpec.cut``); the
pipeline, admission, training and the metrics call its methods instead of
branching on its name, so a new way of reading a document is one class here
and the rows that use it:

- ``segment``: the pieces of each document (stage 2: blocks, windows, none), windows up to the cap it is
  given (the pipeline gives none when the request's window picker keeps the best ones past it,
  ``Resolved.window_picker``);
- ``assemble``: the passages each document contributes (stage 4), from its
  pieces and, for a selecting cut, the selector's block scores;
- ``sequences``: admission's estimate of the cross-encoder inputs it costs,
  from a token count guessed from characters, with the same stride and caps
  that ``segment`` uses, so the estimate cannot drift from what is scored;
- ``evidence``: which passages a document's score rests on (the metrics'
  evidence position);
- ``input_settings``: which settings its model inputs depend on (training's
  cache keys);
- ``max_length`` and ``refuses``: how long one of its inputs may be, and why a
  model cannot be read this way (resolution's 422).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
import numpy as np

from keyrank.config import Settings
from keyrank.doc_cache import DocumentCache
from keyrank.segment import Spans, blocks, windows
from keyrank.select import SelectorSpec
from keyrank.strategies.firstp import first_passage
from keyrank.strategies.keyb2 import key_block_passages, keyb2_passages, lead_trimmed
from keyrank.strategies.passage import Passage
from keyrank.strategies.windows import window_passages
from keyrank.template import InputTemplate
from keyrank.tokenize import Encoded

UNCAPPED = 1 << 62
"""A cap no document reaches: the windows are cut after they are scored (``Resolved.window_picker``)."""
SELECTION_ONLY = ("keyb2_", "bm25_", "dense_", "hybrid_", "block_", "default_selector")
"""Settings that shape only the blocks cut's inputs (its blocks and their selection); windows never read them."""


@dataclass(frozen=True, slots=True)
class CutContext:
    """What cutting needs of one pipeline, built once with it."""

    settings: Settings
    """The stage parameters (block size, stride, caps, keyb2's rules)."""
    break_costs: np.ndarray
    """float64 [vocab] cost of a block break after each token (segment.token_break_costs)."""
    documents: DocumentCache
    """Blocks of documents seen before, by content (doc_cache.py)."""


class DocumentCut(ABC):
    """One way of reading a document; the subclasses below are the six the strategies use."""

    name: str = ""
    """The registry's and the README's name for it."""
    windowed: bool = False
    """Several sequences per document, each a window of it (the windows strategies)."""
    selects: bool = False
    """Its pieces are scored by a block selector before assembly (keyb2)."""
    reads_query_terms: bool = False
    """Its ``assemble`` takes ``anchors=``, the query's rare term ids (keyb2-blocks' lead rule)."""
    needs: str = ""
    """What the model must offer to be read this way (the README's needs column; ``refuses`` enforces it)."""

    @abstractmethod
    def segment(self, docs: list[Encoded], budget: int, max_windows: int, ctx: CutContext) -> list[Spans]:
        """The pieces of every document; ``budget``: document tokens that fit next to the query."""

    @abstractmethod
    def assemble(self, docs: list[Encoded], pieces: list[Spans], block_scores: list[np.ndarray], budget: int,
                 settings: Settings, selector: SelectorSpec | None) -> list[Passage]:
        """The passages each document contributes, grouped by document. A cut with ``reads_query_terms`` is
        also given ``anchors=``, the query's rare term ids (``Pipeline.anchors``)."""

    @abstractmethod
    def sequences(self, tokens: np.ndarray, window: int, settings: Settings, max_windows: int,
                  selector: SelectorSpec | None) -> float:
        """Cross-encoder inputs the documents cost, from their (estimated) token counts ``tokens``, the
        document tokens one input holds (``window``) and the request's caps and selector (``Resolved``)."""

    def evidence(self, passages: Sequence[Passage], best: np.ndarray) -> list[Passage]:
        """The passages the documents' scores rest on: each document's best one."""
        return [passages[i] for i in best]

    def input_settings(self, settings: dict) -> dict:
        """The settings its model inputs depend on: none of the block selection's."""
        return {k: v for k, v in settings.items() if not k.startswith(SELECTION_ONLY)}

    def max_length(self, settings: Settings) -> int:
        """Longest input it builds, the frame included, before the model's own limit caps it."""
        return settings.max_sequence_length

    def refuses(self, template: InputTemplate, settings: Settings) -> str | None:
        """Why the model of ``template`` cannot be read this way (resolution's 422), or None."""
        return None

    def __repr__(self) -> str:
        return f"<cut {self.name}>"


class PrefixCut(DocumentCut):
    """FirstP: the first document tokens that fit; everything after them is never read."""

    name = "prefix"

    def segment(self, docs, budget, max_windows, ctx):
        return []

    def assemble(self, docs, pieces, block_scores, budget, settings, selector):
        return [first_passage(i, len(d), budget) for i, d in enumerate(docs)]

    def sequences(self, tokens, window, settings, max_windows, selector):
        return float(len(tokens))


class WindowCut(DocumentCut):
    """Windows of ``budget`` tokens every ``stride`` tokens, at most ``max_windows`` per document."""

    windowed = True

    @abstractmethod
    def stride(self, window: int, settings: Settings) -> int:
        """Tokens between the starts of two windows."""

    def segment(self, docs, budget, max_windows, ctx):
        """The first ``max_windows`` windows of each document (``UNCAPPED``: every one, the window picker keeps the
        best)."""
        step = self.stride(budget, ctx.settings)
        return [windows(len(d), budget, step, max_windows) for d in docs]

    def assemble(self, docs, pieces, block_scores, budget, settings, selector):
        return [p for i in range(len(docs)) for p in window_passages(i, pieces[i])]

    def sequences(self, tokens, window, settings, max_windows, selector):
        count = 1 + np.ceil(np.maximum(tokens - window, 0) / self.stride(window, settings))
        return float(np.sum(np.minimum(count, max_windows)))


class SlidingCut(WindowCut):
    """MaxP, SumP, PARADE: overlapping windows, half a window apart unless ``window_stride`` says otherwise."""

    name = "sliding"

    def stride(self, window, settings):
        return settings.window_stride or max(1, window // 2)


class DisjointCut(WindowCut):
    """AvgP: back-to-back chunks."""

    name = "disjoint"

    def stride(self, window, settings):
        return window


class BlockCut(DocumentCut):
    """KeyB2: CogLTX blocks, scored by a selector; the best that fit are read (``keyb2_passes`` inputs at most)."""

    name = "blocks"
    selects = True

    def segment(self, docs, budget, max_windows, ctx):
        s = ctx.settings
        return ctx.documents.blocks(docs, lambda d: blocks(d, ctx.break_costs, s.block_max_tokens, s.block_cost))

    def assemble(self, docs, pieces, block_scores, budget, settings, selector):
        return keyb2_passages(docs, pieces, block_scores, budget, settings, selector=selector)

    def sequences(self, tokens, window, settings, max_windows, selector):
        """One reading per document, up to ``keyb2_passes`` while the text lasts, plus the selector's work."""
        reads = np.minimum(settings.keyb2_passes, np.maximum(1, np.ceil(tokens / window)))
        return float(np.sum(reads)) + self.selector_work(tokens, settings, selector)

    @staticmethod
    def selector_work(tokens: np.ndarray, settings: Settings, selector: SelectorSpec | None) -> float:
        """The selector's own work on every block, in model inputs (its row's ``sequences_per_block``)."""
        per_block = selector.sequences_per_block if selector else 0.0
        return float(per_block * np.sum(np.ceil(tokens / settings.block_max_tokens)))

    def evidence(self, passages, best):
        """Every passage: each selected block is evidence, whichever pass scored best."""
        return list(passages)

    def input_settings(self, settings):
        return settings


class KeyBlocksCut(BlockCut):
    """keyb2-blocks: the selector's best ``keyb2_blocks`` blocks in short inputs with the query, those that follow
    each other in the text together (up to ``keyb2_blocks_span``)."""

    name = "key-blocks"
    reads_query_terms = True

    def assemble(self, docs, pieces, block_scores, budget, settings, selector, anchors=None):
        """``anchors``: with ``keyb2_blocks_lead`` set, an input inside a document starts at the query (``lead_trimmed``)."""
        passages = key_block_passages(pieces, block_scores, settings.keyb2_blocks, settings.keyb2_blocks_span, budget)
        if settings.keyb2_blocks_lead is None or anchors is None:
            return passages
        return lead_trimmed(passages, docs, anchors, settings.keyb2_blocks_lead)

    def sequences(self, tokens, window, settings, max_windows, selector):
        """Each input is charged its share of a full one: (its blocks + query + frame) / ``window``, plus the
        selector's own work on every block. A document of at most ``keyb2_blocks`` blocks has them all chosen,
        one after another, so they are read in runs of ``keyb2_blocks_span``; a longer one's chosen blocks may
        all stand apart, one input each."""
        s = settings
        blocks = np.maximum(1, np.ceil(tokens / s.block_max_tokens))
        chosen = np.minimum(blocks, s.keyb2_blocks)
        inputs = np.where(blocks <= s.keyb2_blocks, np.ceil(chosen / s.keyb2_blocks_span), chosen)
        read = chosen * s.block_max_tokens + inputs * (s.query_max_tokens + 3)
        return float(np.sum(np.minimum(read / max(window, 1), chosen))) + self.selector_work(tokens, settings, selector)

    def evidence(self, passages, best):
        """The block the fold rests on most: each document's best-scored one."""
        return DocumentCut.evidence(self, passages, best)


class WholeCut(PrefixCut):
    """LongP: the whole document in one input, up to the model's own length (``longp_max_length`` caps it).

    Its inputs are FirstP's, only longer: what does not fit the model is cut and reported as FirstP's is.
    Attention's cost grows with the square of the length, so admission charges an input of ``n`` tokens
    ``max(1, n / max_sequence_length)`` squared sequences: 256 for 8192 tokens beside 512-token ones.
    """

    name = "whole"
    needs = "a model reading past `max_sequence_length` (512)"

    def sequences(self, tokens, window, settings, max_windows, selector):
        read = np.minimum(tokens, window) / settings.max_sequence_length
        return float(np.sum(np.maximum(1.0, read) ** 2))

    def max_length(self, settings):
        return settings.longp_max_length

    def refuses(self, template, settings):
        reads = min(template.max_length, settings.longp_max_length)
        if reads > settings.max_sequence_length:
            return None
        why = (f"KEYRANK_LONGP_MAX_LENGTH is {settings.longp_max_length}" if template.max_length > settings.max_sequence_length
               else f"this model reads at most {template.max_length} tokens (its position embeddings)")
        return (f"longp reads the whole document in one sequence, but {why}, no more than the "
                f"{settings.max_sequence_length} every strategy reads: longp would be firstp. Serve a long-context "
                f"reranker (ModernBERT, bge-reranker-v2-m3, a decoder reranker), or read long documents with maxp, "
                f"parade-* or keyb2")


PREFIX, SLIDING, DISJOINT, BLOCKS, KEY_BLOCKS, WHOLE = PrefixCut(), SlidingCut(), DisjointCut(), BlockCut(), KeyBlocksCut(), WholeCut()
"""The cuts the registry's rows name (one instance each: rows compare them by identity)."""
