"""KeyB2 (Li et al.): read the key blocks of a document in one 512-token pass.

Blocks are taken in score order until the budget (480 document tokens in the
paper) is spent, the last one cut to fit; the chosen blocks are then put back
in document order so the model reads them as the text runs (or, with
``keyb2_block_order = "score"``, left in score order: the best block first,
wherever it sat in the document).

``SelectionRules`` switches on variants that may read better, each
measured by docs/experiments/selection_ablation.py (docs/SELECTION.md):

- keep the lead block: many documents state their topic first;
- neighbour expansion: the top blocks fill only part of the budget, then their
  neighbours (context around a hit) are added while they fit whole;
- near-duplicate suppression: a block repeating a chosen one is skipped;
- shared-text suppression: a block most of the other candidates also contain is not chosen by score
  (``keyb2_shared_share``; select/shared.py).

The budget itself is the caller's choice (``keyb2_budget``): the paper's fixed
480 tokens, or all that fits next to the query (KeyB's 512 - 3 - q rule).

``keyb2_passes`` reads a document in up to 3 model inputs: the
next-best blocks fill each further one, and the document scores as its best
pass (``aggregate``'s ``max``; with one pass that is its only score).

``keyb2-blocks`` reads the same selection differently (``key_block_passages``): the
``keyb2_blocks`` best blocks in short inputs with the query, those that follow each other
in the text together (up to ``keyb2_blocks_span``), whose scores log-sum-exp folds into one
(aggregate.py; docs/EXPERIMENTS.md, 2026-11-27).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
import numpy as np

from keyrank.config import Settings
from keyrank.segment import Spans, best_indices
from keyrank.select import SelectorSpec
from keyrank.select.duplicates import ChosenSets
from keyrank.select.shared import shared_blocks
from keyrank.strategies.passage import Passage
from keyrank.tokenize import Encoded

BLOCK_ORDERS = ("document", "score")
"""How the chosen blocks are read: as the text runs (the papers), or best-scored first."""
BUDGET_RULES = ("paper480", "fill")
"""``paper480``: the configured fixed budget (480), capped to what fits; ``fill``: all that fits."""


def keyb2_budget(rule: str, fits: int, fixed: int) -> int:
    """Document tokens keyb2 may select.

    ``fits``: document tokens that fit next to the query in one model input
    (``InputTemplate.document_budget(query_tokens)``: 512 - 3 - q for BERT);
    ``fixed``: the configured budget (``keyb2_budget_tokens``, the paper's 480).
    The two agree only for a 29-token query under a BERT template."""
    if rule == "paper480":
        return max(0, min(fixed, fits))
    if rule == "fill":
        return max(0, fits)
    raise ValueError(f"unknown keyb2 budget rule {rule!r}; expected one of {', '.join(BUDGET_RULES)}")


@dataclass(frozen=True, slots=True)
class SelectionRules:
    """How keyb2 chooses blocks once they are scored; the defaults are the paper's plain greedy choice."""

    keep_lead: bool = False
    """Always read block 0 first (cut to the budget if it is longer)."""
    neighbours: bool = False
    """Top blocks fill only ``top_share`` of the budget; then each one's previous and next block
    (top blocks in score order) are added while they fit whole; the rest goes by score."""
    top_share: float = 0.5
    """With ``neighbours``: the share of the budget the top-scored blocks may fill."""
    dedup_jaccard: float | None = None
    """Skip a block whose token set has at least this Jaccard with a chosen block's; None = off."""

    def __post_init__(self) -> None:
        if not 0.0 < self.top_share <= 1.0:
            raise ValueError(f"top_share lies in (0, 1], got {self.top_share}")
        if self.dedup_jaccard is not None and not 0.0 < self.dedup_jaccard <= 1.0:
            raise ValueError(f"dedup_jaccard lies in (0, 1], got {self.dedup_jaccard}")

    @property
    def plain(self) -> bool:
        """No variant on: the paper's greedy choice."""
        return not (self.keep_lead or self.neighbours or self.dedup_jaccard is not None)

    @classmethod
    def from_settings(cls, settings: Settings) -> SelectionRules:
        """The rules named by ``Settings.keyb2_*``."""
        return cls(
            keep_lead=settings.keyb2_keep_lead,
            neighbours=settings.keyb2_neighbours,
            top_share=settings.keyb2_top_share,
            dedup_jaccard=settings.keyb2_dedup_jaccard,
        )


def keyb2_passages(docs: Sequence[Encoded], pieces: Sequence[Spans], block_scores: Sequence[np.ndarray], fits: int,
                   settings: Settings, *, selector: SelectorSpec | None) -> list[Passage]:
    """What keyb2 reads of every document: the settings' budget rule and selection rules in one call.

    ``fits``: document tokens that fit next to the query (``Resolved.budget``); ``settings``: its
    ``keyb2_*`` fields; ``selector``: the row of what scored the blocks. ``keyb2_min_score_share`` applies
    only to a selector whose scores are on a ratio scale (its row's ``ratio_scale``, 0 = no query term: BM25),
    where "half the best block's score" means something; cosines, fused ranks and logits fill the budget."""
    budget = keyb2_budget(settings.keyb2_budget, fits, settings.keyb2_budget_tokens)
    rules = SelectionRules.from_settings(settings)
    share = settings.keyb2_min_score_share
    if share is not None and selector is not None and selector.ratio_scale:
        block_scores = [below_share_dropped(np.asarray(s, dtype=np.float64), share) for s in block_scores]
    if settings.keyb2_shared_share is not None:
        block_scores = shared_dropped(docs, pieces, block_scores, settings.keyb2_shared_share)
    passages = [p for i in range(len(docs))
                for p in reading_passes(i, pieces[i], block_scores[i], budget, docs[i].ids, rules, settings.keyb2_passes)]
    order = settings.keyb2_block_order
    if order == "score":
        return [in_score_order(p, block_scores[p.doc]) for p in passages]
    if order != "document":
        raise ValueError(f"unknown keyb2 block order {order!r}; expected one of {', '.join(BLOCK_ORDERS)}")
    return passages


def key_block_passages(pieces: Sequence[Spans], block_scores: Sequence[np.ndarray], most: int,
                       span: int = 1, fits: int | None = None) -> list[Passage]:
    """keyb2-blocks: each document's ``most`` best blocks by the selector (ties: the earlier), in document order;
    chosen blocks that follow each other in the text are one passage, up to ``span`` blocks and ``fits`` document
    tokens (a passage cut across block boundaries keeps its context; ``span`` 1: each block alone). A document
    without blocks reads one empty passage (the query alone)."""
    out = []
    for doc, (blocks, scores) in enumerate(zip(pieces, block_scores)):
        chosen = best_indices(scores, most).tolist()
        if not chosen:
            out.append(_empty(doc))
            continue
        for run in _adjacent_runs(chosen, blocks.ends - blocks.starts, span, fits):
            idx = np.asarray(run, dtype=np.int64)
            out.append(Passage(doc, blocks.starts[idx], blocks.ends[idx], idx))
    return out


def lead_trimmed(passages: Sequence[Passage], docs: Sequence[Encoded], anchors: np.ndarray, lead: int) -> list[Passage]:
    """keyb2-blocks' inputs with the text before the query left out where an input does not open its document:
    it starts ``lead`` tokens before the first of ``anchors`` (the query's rare term ids) it holds, its blocks
    before that one dropped. The segmentation cuts only where a block must end, so a passage deep in a document
    seldom opens a block, and its first block starts with the end of whatever came before (docs/EXPERIMENTS.md,
    2026-11-27). An input that holds none of ``anchors`` is read whole."""
    if not len(anchors):
        return list(passages)
    anchors = np.asarray(anchors, dtype=np.int64)
    is_anchor = np.zeros(int(anchors.max()) + 2, dtype=bool)  # the last entry stands for every id past the anchors
    is_anchor[anchors] = True
    found: dict[int, np.ndarray] = {}  # where anchors sit in each document read past its start, found once
    out = []
    for p in passages:
        start = int(p.starts[0]) if len(p.starts) else 0
        if start > 0:
            at = found.get(p.doc)
            if at is None:
                at = found[p.doc] = np.flatnonzero(is_anchor[np.minimum(docs[p.doc].ids, is_anchor.size - 1)])
            first = int(at.searchsorted(start))  # the first anchor at or past the input's start
            hit = int(at[first]) - start if first < at.size and at[first] < int(p.ends[-1]) else -1  # a run's blocks follow each other
            if hit > lead:
                p = started_at(p, start + hit - lead)
        out.append(p)
    return out


def started_at(p: Passage, begin: int) -> Passage:
    """``p`` from document token ``begin`` on: its blocks that end by then dropped, the first kept one cut there."""
    keep = p.ends > begin
    starts = p.starts[keep].copy()
    starts[0] = max(int(starts[0]), begin)
    return replace(p, starts=starts, ends=p.ends[keep], pieces=p.pieces[keep])


def _adjacent_runs(indices: list[int], lengths: np.ndarray, span: int, fits: int | None) -> list[list[int]]:
    """Increasing block indices split into runs of consecutive ones, each at most ``span`` blocks and
    ``fits`` tokens (a block alone always makes a run)."""
    runs: list[list[int]] = []
    used = 0
    for i in indices:
        size = int(lengths[i])
        if runs and runs[-1][-1] == i - 1 and len(runs[-1]) < span and (fits is None or used + size <= fits):
            runs[-1].append(i)
            used += size
        else:
            runs.append([i])
            used = size
    return runs


def reading_passes(doc: int, blocks: Spans, scores: np.ndarray, budget: int, ids: np.ndarray | None,
                   rules: SelectionRules, passes: int) -> list[Passage]:
    """Up to ``passes`` passages of one document, each a ``choose_blocks`` over the blocks no earlier
    pass chose: the best blocks fill the first, the next best the second. The first is always there
    (empty for a document without blocks); a later one only while a scored block is left. A block the
    budget cut in one pass is not read again in the next. ``keep_lead`` applies to the first pass."""
    if passes < 1:
        raise ValueError(f"keyb2 reads a document in 1 to 3 passes, got {passes}")
    first = choose_blocks(doc, blocks, scores, budget, ids, rules)
    out = [first]
    if passes == 1:
        return out
    left = np.array(scores, dtype=np.float64, copy=True)
    later = replace(rules, keep_lead=False)
    for _ in range(passes - 1):
        left[out[-1].pieces] = -np.inf
        if not np.isfinite(left).any():
            break
        read = np.concatenate([p.pieces for p in out])
        passage = choose_blocks(doc, blocks, left, budget, ids, later, excluded=read)
        if not len(passage.pieces):  # what is left repeats what was read (near-duplicate suppression)
            break
        out.append(passage)
    return out


def shared_dropped(docs: Sequence[Encoded], pieces: Sequence[Spans], block_scores: Sequence[np.ndarray],
                   share: float) -> list[np.ndarray]:
    """Scores with the blocks the other candidates share (``select/shared.py``) set to -inf; a document whose
    every scored block is shared keeps its scores (it is read as it would be without the rule)."""
    shared = shared_blocks([d.ids for d in docs], pieces, share)
    out = []
    for scores, drop in zip(block_scores, shared):
        scores = np.asarray(scores, dtype=np.float64)
        kept = np.where(drop, -np.inf, scores)
        out.append(kept if np.isfinite(kept).any() else scores)
    return out


def below_share_dropped(scores: np.ndarray, share: float) -> np.ndarray:
    """Scores with the blocks under ``share`` x the best block's set to -inf (never chosen by score).

    An adaptive budget: a document whose only on-topic text is one passage is read as that
    passage, not padded to 480 tokens with its next-best (off-topic) blocks. A document whose
    best block scores <= 0 (no query term at all) keeps every block."""
    top = float(scores.max()) if scores.size else 0.0
    if top <= 0.0:
        return scores
    return np.where(scores >= share * top, scores, -np.inf)


def in_score_order(passage: Passage, scores: np.ndarray) -> Passage:
    """The same blocks, best-scored first (ties: earlier block first)."""
    order = np.lexsort((passage.pieces, -np.asarray(scores)[passage.pieces]))
    return Passage(passage.doc, passage.starts[order], passage.ends[order], passage.pieces[order])


def select_blocks(doc: int, blocks: Spans, scores: np.ndarray, budget: int) -> Passage:
    """The top-scored blocks within ``budget`` tokens, in document order (ties: earlier block first)."""
    if len(blocks) == 0 or budget <= 0:
        return _empty(doc)
    order = np.argsort(-scores, kind="stable")
    order = order[np.isfinite(scores[order])]  # -inf: dropped (below_share_dropped)
    lengths = blocks.lengths[order]
    taken_before = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    room = budget - taken_before
    keep = room > 0
    chosen = order[keep]
    # The last kept block may not fit whole: keep its head.
    ends = blocks.starts[chosen] + np.minimum(lengths[keep], room[keep])
    by_position = np.argsort(chosen)
    return Passage(doc, blocks.starts[chosen][by_position], ends[by_position], chosen[by_position])


def choose_blocks(
    doc: int,
    blocks: Spans,
    scores: np.ndarray,
    budget: int,
    ids: np.ndarray | None = None,
    rules: SelectionRules = SelectionRules(),
    excluded: np.ndarray | None = None,
) -> Passage:
    """``select_blocks`` under ``rules``: never over ``budget``, blocks back in document order.

    ``ids`` (the document's token ids) are needed for near-duplicate suppression only;
    ``excluded``: blocks never taken, not even as a neighbour or the lead (an earlier pass read them).
    """
    if rules.plain:
        return select_blocks(doc, blocks, scores, budget)
    if len(blocks) == 0 or budget <= 0:
        return _empty(doc)
    if rules.dedup_jaccard is not None and ids is None:
        raise ValueError("near-duplicate suppression needs the document's token ids")
    duplicates = None if rules.dedup_jaccard is None else ChosenSets(ids, blocks, rules.dedup_jaccard)
    reader = _Reader(blocks, budget, duplicates, excluded)
    scores = np.asarray(scores)
    order = np.argsort(-scores, kind="stable")
    order = order[np.isfinite(scores[order])]  # -inf: dropped (below_share_dropped)
    if rules.keep_lead:
        reader.take(0, cut=True)
    if rules.neighbours:
        top_room = max(1, int(budget * rules.top_share))
        top: list[int] = []
        for block in order.tolist():
            taken = reader.take(block, cut=False, room=top_room)
            if taken is _Taken.TOO_LONG:
                break
            if taken in (_Taken.YES, _Taken.ALREADY):
                top.append(block)
        for block in top:
            for neighbour in (block - 1, block + 1):
                if 0 <= neighbour < len(blocks):
                    reader.take(neighbour, cut=False)
    for block in order.tolist():
        if reader.full:
            break
        reader.take(block, cut=True)
    return reader.passage(doc)


class _Taken(Enum):
    YES = "taken"
    ALREADY = "already chosen"
    REPEAT = "near-duplicate of a chosen block"
    TOO_LONG = "does not fit whole"


class _Reader:
    """The blocks chosen so far and the budget they leave."""

    def __init__(self, blocks: Spans, budget: int, duplicates: ChosenSets | None, excluded: np.ndarray | None = None):
        self.blocks = blocks
        self.budget = budget
        self.used = 0
        self.lengths: dict[int, int] = {}
        self.duplicates = duplicates
        self.excluded = frozenset(() if excluded is None else excluded.tolist())

    @property
    def full(self) -> bool:
        return self.used >= self.budget

    def take(self, block: int, *, cut: bool, room: int | None = None) -> _Taken:
        """Choose ``block`` if it fits in ``room`` (default: the budget); ``cut`` keeps the head of one that does not."""
        if block in self.lengths or block in self.excluded:
            return _Taken.ALREADY
        left = (self.budget if room is None else min(room, self.budget)) - self.used
        length = int(self.blocks.lengths[block])
        if left <= 0 or (length > left and not cut):
            return _Taken.TOO_LONG
        if self.duplicates is not None:
            if self.duplicates.repeats(block):
                return _Taken.REPEAT
            self.duplicates.add(block)
        self.lengths[block] = min(length, left)
        self.used += self.lengths[block]
        return _Taken.YES

    def passage(self, doc: int) -> Passage:
        chosen = np.array(sorted(self.lengths), dtype=np.int64)
        starts = self.blocks.starts[chosen]
        ends = starts + np.array([self.lengths[b] for b in chosen.tolist()], dtype=np.int64)
        return Passage(doc, starts, ends, chosen)


def _empty(doc: int) -> Passage:
    empty = np.zeros(0, dtype=np.int64)
    return Passage(doc, empty, empty, empty)
