"""keyb2-blocks with each chosen block read together with its neighbours: does a fine-tuned scorer want context?

    BLOCKS_CONTEXT=1 PYTHONPATH=service python docs/experiments/blocks_context.py <keyrank eval arguments>

keyb2-blocks reads a document's ``keyb2_blocks`` best blocks (by the selector) in short inputs, adjacent chosen
blocks together up to ``keyb2_blocks_span``. Here every chosen block brings the ``BLOCKS_CONTEXT`` blocks before
and after it into the same input (the span grows by 2 x BLOCKS_CONTEXT, inputs still fit the model), so each
input holds its block's surroundings, as a window does; BLOCKS_CONTEXT=0 is the served reading (a control). The
strategy keeps its name (keyb2-blocks); run once per BLOCKS_CONTEXT into its own --out. Nothing in the product
changes (docs/EXPERIMENTS.md, 2026-12-02).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import numpy as np

from keyrank.evaluation import cli
from keyrank.segment import best_indices
from keyrank.strategies import cuts

CONTEXT = int(os.environ.get("BLOCKS_CONTEXT", "1"))
_served = cuts.key_block_passages


def with_neighbours(pieces, block_scores, most, span=1, fits=None):
    """``key_block_passages`` with ``CONTEXT`` neighbours on each side of every chosen block: the served function
    run per document on scores that mark the chosen blocks and their neighbours, all of them chosen."""
    out = []
    for doc, (blocks, scores) in enumerate(zip(pieces, block_scores)):
        marked = np.zeros(len(scores))
        for i in best_indices(scores, most).tolist():
            marked[max(0, i - CONTEXT):i + CONTEXT + 1] = 1.0
        wanted = max(1, int(marked.sum()))
        out += [replace(p, doc=doc) for p in _served([blocks], [marked], wanted, span + 2 * CONTEXT, fits)]
    return out


if __name__ == "__main__":
    cuts.key_block_passages = with_neighbours
    sys.exit(cli.main(sys.argv[1:]))
