"""What one model input holds of one document: token ranges, with the pieces they came from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Passage:
    """What one model input holds of one document."""

    doc: int
    """Index of the document in the request."""
    starts: np.ndarray
    """int64 [k] token ranges of the document, in document order ..."""
    ends: np.ndarray
    """int64 [k] ... concatenated, they are the passage."""
    pieces: np.ndarray
    """int64 [k] index of each range's block or window (the evidence position)."""

    @property
    def n_tokens(self) -> int:
        return int((self.ends - self.starts).sum())
