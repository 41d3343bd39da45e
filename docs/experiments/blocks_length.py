"""keyb2-blocks' log-sum-exp with each input's logit shifted by b x ln(its length / 128): is a scorer trained on
512-token inputs calibrated for keyb2-blocks' short ones?

    PYTHONPATH=service python docs/experiments/blocks_length.py <keyrank eval arguments, without --strategies>
    BLOCKS_LENGTH_BIAS=0.5 PYTHONPATH=service python docs/experiments/blocks_length.py ...   # one b only

keyb2-blocks reads a document's chosen blocks in inputs of one to four blocks (~60-250 tokens) and folds their
logits by log-sum-exp. A scorer fine-tuned on keyb2's 512-token inputs may rate a short input differently from a
longer one holding the same evidence; a term b x ln(n / 128) per input of n tokens (b > 0: longer inputs count for
more) is the simplest calibration. Each b is a system of the run (`lc<b>`; `lc0.0` is the served default, a
control), all reading the very same inputs, scored once. A diagnostic for choosing on dev: nothing in the product
changes (docs/EXPERIMENTS.md, 2026-12-02).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import numpy as np

from keyrank import reranker
from keyrank.aggregate import Aggregated, aggregate, length_calibrated
from keyrank.evaluation import cli
from keyrank.strategies import REGISTRY

BIASES = tuple(float(b) for b in os.environ.get("BLOCKS_LENGTH_BIAS", "-1,-0.5,0,0.5,1").split(","))
_lengths: dict[str, np.ndarray] = {}
_fold = reranker.Reranker.fold


def fold(self, plan, logits, pooled, timer=None):
    """``Reranker.fold``, noting the plan's input lengths for ``folded``."""
    _lengths["plan"] = np.array([len(ids) for ids in plan.inputs.ids], dtype=np.float64)
    return _fold(self, plan, logits, pooled, timer)


def folded(method, doc_of, logits, pooled, head, trained):
    """``aggregate``, and ``lc<b>``: log-sum-exp of the logits shifted by b x ln(length / 128), as
    ``keyb2_blocks_length_bias`` = b serves them (``aggregate.length_calibrated``)."""
    if not method.startswith("lc"):
        return aggregate(method, doc_of, logits, pooled, head, trained)
    shifted = length_calibrated(logits, _lengths["plan"], float(method[2:]))
    return Aggregated(scores=aggregate("lse", doc_of, shifted).scores, best=aggregate("max", doc_of, logits).best)


if __name__ == "__main__":
    names = tuple(f"lc{b}" for b in BIASES)
    for name in names:
        REGISTRY[name] = replace(REGISTRY["keyb2-blocks"], name=name, aggregation=name)
    reranker.Reranker.fold = fold
    reranker.aggregate = folded
    cli.STRATEGIES = tuple(cli.STRATEGIES) + names
    sys.exit(cli.main([*sys.argv[1:], "--strategies", *names]))
