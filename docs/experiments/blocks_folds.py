"""keyb2-blocks' inputs folded other ways than PARADE-max: do several inputs' evidence add up?

    PYTHONPATH=service python docs/experiments/blocks_folds.py <keyrank eval arguments, without --strategies>

keyb2-blocks reads a document's best blocks in short inputs; when this was written it scored a document
with the classifier head on the element-wise max of their pooled vectors (PARADE-max). Averaging reads long meetings better (several relevant inputs
count) but loses a lone relevant passage among filler. This runs `keyrank eval` with keyb2-blocks and the
same reading under other folds, each a system of the run; every fold reads the very same inputs, so the
evaluation's memo scores them once:

- `kbf-pmax`: PARADE-max, what keyb2-blocks served then (a control: it read as keyb2-blocks did);
- `kbf-max`: the best input's logit;
- `kbf-lse`: log-sum-exp of the inputs' logits (a soft max: a second strong input adds, a weak one hardly;
  chosen, now ``aggregate``'s ``lse`` and what keyb2-blocks serves);
- `kbf-pmax-lse`: PARADE-max plus what log-sum-exp adds to the max logit;
- `kbf-pmix`: the head on the mean of the max and the mean pooled vectors;
- `kbf-top2`: the mean of the two best logits (one input: its logit);
- `kbf-lme`: log-mean-exp, log-sum-exp less the log of the document's input count (so that a document whose
  chosen blocks fall in more separate runs gains nothing for that alone);
- `kbf-lse-t0.5`, `kbf-lse-t2`: log-sum-exp at temperature t, t log sum exp(logit / t) (t -> 0: the max; larger
  t: closer to a sum of the inputs' evidence).

A diagnostic for choosing on dev: nothing in the product changes.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np

from keyrank import reranker
from keyrank.aggregate import Aggregated, aggregate
from keyrank.evaluation import cli
from keyrank.strategies import REGISTRY

FOLDS = ("pmax", "max", "lse", "pmax-lse", "pmix", "top2", "lme", "lse-t0.5", "lse-t2")


def folded(method, doc_of, logits, pooled, head, trained):
    """``aggregate`` with the folds above (``kbf-<fold>``) besides its own methods."""
    if not method.startswith("kbf-"):
        return aggregate(method, doc_of, logits, pooled, head, trained)
    fold = method[4:]
    base = aggregate("parade-max", doc_of, logits, pooled, head, trained)
    best = aggregate("max", doc_of, logits).scores
    lse = aggregate("lse", doc_of, logits).scores
    firsts = np.flatnonzero(np.concatenate(([True], doc_of[1:] != doc_of[:-1])))
    if fold == "pmax":
        scores = base.scores
    elif fold == "max":
        scores = best
    elif fold == "lse":
        scores = lse
    elif fold == "pmax-lse":
        scores = base.scores + (lse - best)
    elif fold == "pmix":
        p = np.asarray(pooled, dtype=np.float64)
        counts = np.diff(np.append(firsts, len(doc_of)))
        scores = head((np.maximum.reduceat(p, firsts, axis=0) + np.add.reduceat(p, firsts, axis=0) / counts[:, None]) / 2)
    elif fold == "lme":
        scores = lse - np.log(np.diff(np.append(firsts, len(doc_of))))
    elif fold.startswith("lse-t"):
        t = float(fold[5:])
        scores = t * aggregate("lse", doc_of, np.asarray(logits, dtype=np.float64) / t).scores
    elif fold == "top2":
        scores = np.array([np.sort(g)[-2:].mean() for g in np.split(np.asarray(logits, dtype=np.float64), firsts[1:])])
    else:
        raise ValueError(fold)
    return Aggregated(scores=np.asarray(scores, dtype=np.float64), best=base.best)


if __name__ == "__main__":
    names = tuple(f"kbf-{f}" for f in FOLDS)
    for name in names:
        REGISTRY[name] = replace(REGISTRY["keyb2-blocks"], name=name, aggregation=name, needs_pooled=True)
    reranker.aggregate = folded
    cli.STRATEGIES = tuple(cli.STRATEGIES) + names
    sys.exit(cli.main([*sys.argv[1:], "--strategies", *names]))
