"""Cross selector: the cross-encoder scores each block alone with the query (KeyB2's costliest selector).

It is the one selector whose scores the gateway cannot compute itself: its ``score`` answers a
``ModelRoundTrip``, each block framed alone with the query, which the caller has the model score (the reranker
awaits its scorer between ``Pipeline.start`` and ``Pipeline.finish``; training and bench pass a synchronous
one to ``Pipeline.plan``); the logits come back as each document's block scores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from keyrank.scoring import ModelInputs
from keyrank.segment import per_document
from keyrank.select import ModelRoundTrip

if TYPE_CHECKING:
    from keyrank.select import SelectorContext
    from keyrank.segment import Spans
    from keyrank.template import InputTemplate
    from keyrank.tokenize import Encoded


class CrossSelector:
    """The ``cross`` selector: every block alone with the query, framed by the model's template, scored by the model."""

    def __init__(self, template: InputTemplate):
        self.template = template
        """How the model frames the query and a block."""

    def score(self, query_text: str, query: Encoded, docs: list[Encoded], pieces: list[Spans]) -> ModelRoundTrip | list[np.ndarray]:
        blocks = [(d.ids, sp.starts[k : k + 1], sp.ends[k : k + 1]) for d, sp in zip(docs, pieces) for k in range(len(sp))]
        if not blocks:  # no document has a block: nothing for the model to score
            return [np.zeros(0) for _ in pieces]
        inputs = ModelInputs(*self.template.build_all(query.ids, blocks))
        return ModelRoundTrip(inputs, lambda logits: per_document(np.asarray(logits, np.float64), pieces))


def build(context: SelectorContext) -> CrossSelector:
    return CrossSelector(context.template)
