"""Stage 4: what the cross-encoder reads for each document, per strategy.

A strategy turns a tokenized document (and, for keyb2, its scored blocks) into
``Passage``s: token ranges of the document that are concatenated after the
query. Pure functions over arrays: no I/O, no HTTP, no Triton.

| strategy    | passages per document              | aggregation          |
|-------------|------------------------------------|----------------------|
| firstp      | the first tokens that fit          | single               |
| maxp / sump | sliding windows (stride = half)    | max / sum of scores  |
| avgp        | disjoint chunks                    | mean of scores       |
| parade-max  | sliding windows                    | max of pooled, head  |
| parade-avg  | sliding windows                    | mean of pooled, head |
| keyb2       | the selected blocks, one sequence  | single               |
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from keyrank.tokenize import Encoded

# Strategy name -> aggregation name (aggregate.py).
AGGREGATION = {
    "firstp": "single",
    "maxp": "max",
    "sump": "sum",
    "avgp": "mean",
    "parade-max": "parade-max",
    "parade-avg": "parade-avg",
    "keyb2": "single",
}
WINDOWED = frozenset({"maxp", "sump", "avgp", "parade-max", "parade-avg"})


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


def model_input(query: Encoded, doc: Encoded, passage: Passage, cls_id: int, sep_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``[CLS] q [SEP] p [SEP]`` ids and token types (0 for the query part, 1 for the passage)."""
    parts = [np.array([cls_id], dtype=np.int64), query.ids, np.array([sep_id], dtype=np.int64)]
    parts += [doc.ids[s:e] for s, e in zip(passage.starts, passage.ends)]
    parts.append(np.array([sep_id], dtype=np.int64))
    ids = np.concatenate(parts)
    types = np.zeros(ids.shape[0], dtype=np.int64)
    types[len(query) + 2 :] = 1
    return ids, types


def passage_budget(query_tokens: int, max_sequence_length: int) -> int:
    """Document tokens that fit next to the query: [CLS] q [SEP] p [SEP] <= max length."""
    return max(1, max_sequence_length - query_tokens - 3)
