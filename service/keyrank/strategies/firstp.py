"""FirstP: the document's first tokens, what truncating rerankers read."""

from __future__ import annotations

import numpy as np

from keyrank.strategies.passage import Passage


def first_passage(doc: int, n_tokens: int, budget: int) -> Passage:
    """Tokens [0, min(n, budget)): everything after the budget is never seen."""
    end = min(n_tokens, budget)
    return Passage(doc, np.zeros(1, np.int64), np.full(1, end, np.int64), np.zeros(1, np.int64))
