"""MaxP / SumP / AvgP / PARADE: every window of the document is one passage.

(The cross selector and keyb2-blocks read blocks the same way: each block alone, one passage.)"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from keyrank.segment import Spans
from keyrank.strategies.passage import Passage


def window_passages(doc: int, spans: Spans, which: Sequence[int] | None = None) -> list[Passage]:
    """One passage per piece (window or block), or per piece of ``which`` (indices into ``spans``, in the order
    given), each remembering its index for evidence."""
    return [
        Passage(doc, spans.starts[i : i + 1], spans.ends[i : i + 1], np.array([i], dtype=np.int64))
        for i in (range(len(spans)) if which is None else which)
    ]
