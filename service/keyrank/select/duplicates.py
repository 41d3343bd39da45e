"""Near-duplicate blocks: a block that repeats one already chosen spends budget on nothing new.

Meetings, forums and web pages repeat themselves (greetings, boilerplate,
quoted replies), and a lexical selector scores every copy of a matching block
alike. A candidate is dropped when the Jaccard similarity of its token-id set
with a chosen block's reaches the threshold. Blocks are at most 63 tokens, so
sets are small: each candidate is compared with all chosen blocks at once
(one ``isin`` + ``bincount``), never pair by pair.
"""

from __future__ import annotations

import numpy as np

from keyrank.segment import Spans


def token_set(ids: np.ndarray, blocks: Spans, block: int) -> np.ndarray:
    """int64 [u]: the distinct token ids of one block, sorted."""
    return np.unique(ids[blocks.starts[block] : blocks.ends[block]])


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """|a & b| / |a | b| of two sets given as distinct ids; two empty sets are identical (1.0)."""
    union = np.union1d(a, b).shape[0]
    return 1.0 if union == 0 else np.intersect1d(a, b, assume_unique=True).shape[0] / union


class ChosenSets:
    """Token sets of the blocks chosen so far, flattened, to test candidates against all of them at once."""

    def __init__(self, ids: np.ndarray, blocks: Spans, threshold: float):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"a Jaccard threshold lies in (0, 1], got {threshold}")
        self.ids = ids
        """int64 [n] the document's token ids."""
        self.blocks = blocks
        """The document's blocks."""
        self.threshold = threshold
        """Jaccard at or above which a candidate counts as a repeat."""
        self._tokens: list[np.ndarray] = []
        self._sizes: list[int] = []

    def repeats(self, block: int) -> bool:
        """Whether ``block`` is a near-duplicate of a chosen block."""
        if not self._tokens:
            return False
        candidate = token_set(self.ids, self.blocks, block)
        chosen = np.concatenate(self._tokens)
        owner = np.repeat(np.arange(len(self._tokens)), self._sizes)
        shared = np.bincount(owner[np.isin(chosen, candidate, assume_unique=False)], minlength=len(self._tokens))
        union = np.asarray(self._sizes) + candidate.shape[0] - shared
        # Two empty blocks (no tokens) are the same block.
        similarity = np.divide(shared, union, out=np.ones(shared.shape), where=union > 0)
        return bool((similarity >= self.threshold).any())

    def add(self, block: int) -> None:
        """Remember ``block`` as chosen."""
        tokens = token_set(self.ids, self.blocks, block)
        self._tokens.append(tokens)
        self._sizes.append(int(tokens.shape[0]))
