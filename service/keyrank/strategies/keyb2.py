"""KeyB2 (Li et al.): read the key blocks of a document in one 512-token pass.

Blocks are taken in score order until the budget (480 document tokens in the
paper) is spent, the last one cut to fit; the chosen blocks are then put back
in document order so the model reads them as the text runs.
"""

from __future__ import annotations

import numpy as np

from keyrank.segment import Spans
from keyrank.strategies import Passage


def select_blocks(doc: int, blocks: Spans, scores: np.ndarray, budget: int) -> Passage:
    """The top-scored blocks within ``budget`` tokens, in document order (ties: earlier block first)."""
    if len(blocks) == 0 or budget <= 0:
        empty = np.zeros(0, dtype=np.int64)
        return Passage(doc, empty, empty, empty)
    order = np.argsort(-scores, kind="stable")
    lengths = blocks.lengths[order]
    taken_before = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    room = budget - taken_before
    keep = room > 0
    chosen = order[keep]
    # The last kept block may not fit whole: keep its head.
    ends = blocks.starts[chosen] + np.minimum(lengths[keep], room[keep])
    by_position = np.argsort(chosen)
    return Passage(doc, blocks.starts[chosen][by_position], ends[by_position], chosen[by_position])
