"""Far-relevant with the insert at a filler-passage boundary: is the deep offsets' gap the seam?

    PYTHONPATH=service python docs/experiments/farrel_seam.py <keyrank eval arguments>

The far-relevant construction starts the insert at an exact token offset, so below
offset 0 it cuts a filler passage in two: the insert follows a stray fragment and is
followed by the rest of that passage, both joined mid-sentence. This runs
`keyrank eval` with one change to the construction: the insert starts at the last
filler-passage boundary at or before the offset (whole filler passages before it,
whole ones after; its documents keep their length). Offset 0 is unchanged, a deeper
one moves back by less than one filler passage, and the bucket keeps its nominal name.
If reading deep inserts worse is the seam, the gap to offset 0 closes here; if it is
position, it stays. A diagnostic: the benchmark itself is not changed.
"""

from __future__ import annotations

import sys

import numpy as np

from keyrank.data import farrelevant as fr
from keyrank.evaluation.cli import main
from keyrank.tokenize import Encoded

INSERT_AT_TOKEN = fr.insert
"""The construction's own insert (at an exact token offset), kept before ``__main__`` replaces it."""


def insert_at_boundary(filler: list[Encoded], passage: Encoded, offset: int) -> tuple[str, tuple[int, int]]:
    """``fr.insert`` at the end of the whole filler passages that end at or before ``offset``."""
    boundary = 0
    for piece in filler:
        if boundary + len(piece) > offset:
            break
        boundary += len(piece)
    return INSERT_AT_TOKEN(filler, passage, boundary)


def check_at_boundary(tokenizer, texts, spans, passages, offset) -> None:
    """Each insert is there whole, at a token start no later than ``offset``."""
    heads = [text[:end] for text, (_, end) in zip(texts, spans)]
    for enc, span, passage in zip(tokenizer.encode_documents(heads), spans, passages):
        found = np.flatnonzero(enc.offsets[:, 0] == span[0])
        at = int(found[0]) if found.size else -1
        if not 0 <= at <= offset or not np.array_equal(enc.ids[at:at + len(passage)], passage.ids):
            raise AssertionError(f"insert at token {at}, wanted a boundary at or before {offset}")


if __name__ == "__main__":
    fr.insert = insert_at_boundary
    fr.check_offsets = check_at_boundary
    sys.exit(main(sys.argv[1:]))
