"""Stage 4: what the cross-encoder reads for each document, per strategy.

A strategy turns a tokenized document (and, for keyb2, its scored blocks) into
``Passage``s: token ranges of the document that the model's template puts
after the query. Pure functions over arrays: no I/O, no HTTP, no Triton.

``REGISTRY`` is the one table of strategies: the config's ``Strategy`` type,
the API's enum and the README's table read it, and each row carries its
behaviour: its cut (``cuts.py``: segmentation, assembly, cost) and its
aggregation (aggregate.py). Adding a strategy is one row here, plus a
``DocumentCut`` in ``cuts.py`` or an aggregation if it needs a new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from keyrank.names import STRATEGIES
from keyrank.strategies.passage import Passage
from keyrank.strategies.cuts import BLOCKS, DISJOINT, KEY_BLOCKS, PREFIX, SLIDING, WHOLE, DocumentCut

__all__ = ["REGISTRY", "STRATEGIES", "Passage", "StrategySpec", "markdown_table"]


@dataclass(frozen=True, slots=True)
class StrategySpec:
    """One strategy: how it cuts a document, what it scores, how it folds the scores."""

    name: str
    """The API's name for it."""
    cut: DocumentCut
    """How the document is read (cuts.py): ``prefix``: the first tokens; ``sliding``: overlapping windows
    (stride = half by default); ``disjoint``: back-to-back chunks; ``blocks``: CogLTX blocks, selected (keyb2);
    ``key-blocks``: the best selected blocks in short inputs, adjacent ones together (keyb2-blocks);
    ``whole``: the whole document in one input, up to the model's own length (longp)."""
    aggregation: str
    """How sequence scores become a document score (aggregate.py ``METHODS``)."""
    needs_pooled: bool = False
    """The model must also return each sequence's pooled vector."""
    trained_parts: tuple[str, ...] = ()
    """Files under models/gateway/ that training writes and this strategy cannot run without."""
    features: str | None = None
    """An interaction graph under models/gateway/ that scores this strategy's sequences in place of the
    cross-encoder, answering each chunk's small additive features as its pooled vector (interaction.py)."""
    summary: str = ""
    """What the cross-encoder reads and how the document is scored (docs and OpenAPI)."""
    least_passes: int = 1
    """Blocks cut: the fewest model inputs per document it reads; ``keyb2_passes`` raises it, never lowers it
    (a fold over pooled vectors needs more than one pass to differ from keyb2)."""
    trainable: bool = False
    """``keyrank finetune --strategy`` trains it: the scorer on its inputs, or its trained part."""
    plans_as: str | None = None
    """A trainable row whose own plan needs the trained part training is about to write: the row of the same cut,
    needing no trained part, whose plan it trains on (PARADE-Attn: parade-max's windows)."""

    @property
    def needs_selector(self) -> bool:
        """Blocks are scored by a selector (bm25, dense, hybrid, cross) before assembly."""
        return self.cut.selects

    @property
    def windowed(self) -> bool:
        """Several sequences per document, each a window of it."""
        return self.cut.windowed

    def missing_parts(self, gateway_dir: Path | None) -> list[str]:
        """Its trained parts that are not installed in ``gateway_dir`` (a prepared model's gateway/; None: no
        model folder, so every one): the one test of whether this strategy can be served."""
        return [part for part in self.trained_parts if gateway_dir is None or not (gateway_dir / part).exists()]


REGISTRY: dict[str, StrategySpec] = {
    spec.name: spec
    for spec in (
        StrategySpec("firstp", PREFIX, "single", trainable=True, summary="the first document tokens that fit; its score"),
        StrategySpec("maxp", SLIDING, "max", trainable=True, summary="sliding windows; max of window scores"),
        StrategySpec("sump", SLIDING, "sum", summary="sliding windows; sum of window scores"),
        StrategySpec("avgp", DISJOINT, "mean", summary="disjoint chunks; mean of chunk scores"),
        StrategySpec("parade-max", SLIDING, "parade-max", needs_pooled=True,
                     summary="sliding windows; classifier head on the element-wise max of pooled vectors"),
        StrategySpec("parade-avg", SLIDING, "parade-avg", needs_pooled=True,
                     summary="sliding windows; classifier head on the mean pooled vector"),
        StrategySpec("parade-attn", SLIDING, "trained", trainable=True, plans_as="parade-max", needs_pooled=True,
                     trained_parts=("parade-attn.onnx",),
                     summary="sliding windows; trained attention over pooled vectors (PARADE-Attn)"),
        StrategySpec("parade-transformer", SLIDING, "trained", trainable=True, plans_as="parade-max", needs_pooled=True,
                     trained_parts=("parade-transformer.onnx",),
                     summary="sliding windows; trained transformer over pooled vectors (PARADE-Transformer)"),
        StrategySpec("cedr-knrm", DISJOINT, "trained", trainable=True, plans_as="avgp", needs_pooled=True,
                     trained_parts=("cedr-knrm.onnx", "cedr-knrm-features.onnx"), features="cedr-knrm-features.onnx",
                     summary="disjoint chunks; per layer, query token and RBF kernel, the chunks' kernel sums of "
                             "query x document token similarities, added up; trained KNRM head over their logs "
                             "and the mean pooled vector (CEDR-KNRM)"),
        StrategySpec("cedr-drmm", DISJOINT, "trained", trainable=True, plans_as="avgp", needs_pooled=True,
                     trained_parts=("cedr-drmm.onnx", "cedr-drmm-features.onnx"), features="cedr-drmm-features.onnx",
                     summary="disjoint chunks; per layer and query token, histograms of query x document token "
                             "similarities, counts added up; trained DRMM head over their log-counts and the mean "
                             "pooled vector (CEDR-DRMM)"),
        StrategySpec("cedr-pacrr", DISJOINT, "trained", trainable=True, plans_as="avgp", needs_pooled=True,
                     trained_parts=("cedr-pacrr.onnx", "cedr-pacrr-features.onnx"), features="cedr-pacrr-features.onnx",
                     summary="disjoint chunks; per query token, the k largest values of learned n-gram convolutions "
                             "of the layers' similarity matrices in each chunk, k-max of the chunks' k-maxes; trained "
                             "PACRR head and the mean pooled vector (CEDR-PACRR; windows across chunk boundaries unread)"),
        StrategySpec("model1", DISJOINT, "trained", trainable=True, plans_as="avgp", needs_pooled=True,
                     trained_parts=("model1.onnx", "model1-features.onnx"), features="model1-features.onnx",
                     summary="disjoint chunks; per query token, the chunks' sums of a learned translation "
                             "probability T(q|d) over last-layer token embeddings, added up; the document's "
                             "IBM Model 1 log-likelihood (Neural Model 1)"),
        StrategySpec("keyb2", BLOCKS, "max", trainable=True,
                     summary="CogLTX blocks ranked by the selector, the best that fit, in document order: one sequence "
                             "(`keyb2_passes` up to 3: the next best in each further one; max of their scores)"),
        StrategySpec("keyb2-parade-max", BLOCKS, "parade-max", needs_pooled=True, least_passes=2,
                     summary="keyb2's passes (at least 2, `keyb2_passes` up to 3); classifier head on the element-wise "
                             "max of their pooled vectors"),
        StrategySpec("keyb2-parade-avg", BLOCKS, "parade-avg", needs_pooled=True, least_passes=2,
                     summary="keyb2's passes (at least 2, `keyb2_passes` up to 3); classifier head on their mean "
                             "pooled vector"),
        StrategySpec("keyb2-blocks", KEY_BLOCKS, "lse", trainable=True,
                     summary="the selector's best `keyb2_blocks` blocks (6), in short sequences with the query: chosen "
                             "blocks that follow each other read together, up to `keyb2_blocks_span` (4), an input inside the "
                             "document from `keyb2_blocks_lead` (4) tokens before the first rare query term it holds; "
                             "log-sum-exp of their scores, a soft max where a second strong input adds (the default)"),
        StrategySpec("keyb2-blocks-attn", KEY_BLOCKS, "trained", trainable=True, plans_as="keyb2-blocks", needs_pooled=True,
                     trained_parts=("keyb2-blocks-attn.onnx",),
                     summary="keyb2-blocks' inputs; trained attention over their pooled vectors (PARADE-Attn over what "
                             "keyb2-blocks reads)"),
        StrategySpec("longp", WHOLE, "single",
                     summary="the whole document in one sequence, up to the model's own length (long-context rerankers: "
                             "ModernBERT, bge-reranker-v2-m3, decoders); its score"),
    )
}
# STRATEGIES (names.py) names these rows in this order; tests/test_strategy_registry.py keeps the two equal.


def markdown_table() -> str:
    """The README's strategy table, written from the registry (a test keeps the README equal to it)."""
    rows = ["| strategy | cut | what the cross-encoder reads; document score | needs |", "| --- | --- | --- | --- |"]
    for spec in REGISTRY.values():
        needs = [n for n, on in (("a selector", spec.needs_selector), ("pooled vectors", spec.needs_pooled)) if on]
        needs += [f"trained `{part}`" for part in spec.trained_parts] + ([spec.cut.needs] if spec.cut.needs else [])
        rows.append(f"| `{spec.name}` | {spec.cut.name} | {spec.summary} | {', '.join(needs) or '-'} |")
    return "\n".join(rows)

