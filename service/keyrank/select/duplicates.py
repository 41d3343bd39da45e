"""Near-duplicate blocks: a block that repeats one already chosen spends budget on nothing new.

Meetings, forums and web pages repeat themselves (greetings, boilerplate,
quoted replies), and a lexical selector scores every copy of a matching block
alike. A candidate is dropped when the Jaccard similarity of its token-id set
with a chosen block's reaches the threshold. Blocks are at most 63 tokens, so
sets are small: the chosen blocks are rows of a boolean matrix over the
tokens they hold, and a candidate is compared with all of them in one
gather-and-sum, never pair by pair.
"""

from __future__ import annotations

import numpy as np

from keyrank.segment import Spans


class ChosenSets:
    """Token sets of the blocks chosen so far, to test a candidate against all of them at once."""

    def __init__(self, ids: np.ndarray, blocks: Spans, threshold: float):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"a Jaccard threshold lies in (0, 1], got {threshold}")
        self.ids = ids
        """int64 [n] the document's token ids."""
        self.blocks = blocks
        """The document's blocks."""
        self.threshold = threshold
        """Jaccard at or above which a candidate counts as a repeat."""
        # Chosen sets are rows of booleans over the tokens seen in chosen blocks (at most the budget's
        # worth), numbered as they come: a candidate's other tokens cannot be shared with any of them.
        self._column: dict[int, int] = {}
        self._members = np.zeros((16, 1024), dtype=bool)
        self._sizes = np.zeros(16, dtype=np.int64)
        self._count = 0
        self._last: tuple[int, list[int]] | None = None

    def _tokens(self, block: int) -> list[int]:
        # A candidate tested by ``repeats`` is usually ``add``ed next: its set is computed once.
        if self._last is None or self._last[0] != block:
            self._last = (block, list(set(self.ids[self.blocks.starts[block] : self.blocks.ends[block]].tolist())))
        return self._last[1]

    def repeats(self, block: int) -> bool:
        """Whether ``block`` is a near-duplicate of a chosen block."""
        if self._count == 0:
            return False
        tokens = self._tokens(block)
        columns = [self._column[t] for t in tokens if t in self._column]
        shared = self._members[: self._count, columns].sum(axis=1)
        union = self._sizes[: self._count] + len(tokens) - shared
        if not union.all():
            return True  # an empty candidate and an empty chosen block: the same block
        return bool(np.any(shared / union >= self.threshold))

    def add(self, block: int) -> None:
        """Remember ``block`` as chosen."""
        tokens = self._tokens(block)
        columns = [self._column.setdefault(t, len(self._column)) for t in tokens]
        rows, width = self._members.shape
        if self._count == rows or len(self._column) > width:
            grown = np.zeros((2 * rows if self._count == rows else rows, max(width, 2 * len(self._column))), dtype=bool)
            grown[:rows, :width] = self._members
            self._members = grown
            self._sizes = np.concatenate([self._sizes, np.zeros(grown.shape[0] - rows, dtype=np.int64)])
        self._members[self._count, columns] = True
        self._sizes[self._count] = len(tokens)
        self._count += 1
