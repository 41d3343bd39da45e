"""MaxP / SumP / AvgP / PARADE: every window of the document is one passage.

(The cross selector reads blocks the same way: each block alone, one passage.)"""

from __future__ import annotations

import numpy as np

from keyrank.segment import Spans
from keyrank.strategies.passage import Passage


def window_passages(doc: int, spans: Spans) -> list[Passage]:
    """One passage per piece (window or block), each remembering its index for evidence."""
    return [
        Passage(doc, spans.starts[i : i + 1], spans.ends[i : i + 1], np.array([i], dtype=np.int64))
        for i in range(len(spans))
    ]
