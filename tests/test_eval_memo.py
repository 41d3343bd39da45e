"""The evaluation's memoising scorer answers exactly what the model answers, scoring each distinct sequence once."""

from __future__ import annotations

import asyncio

import numpy as np
from keyrank.evaluation.memo import MemoScorer
from keyrank.scoring import ModelInputs, Scores


class Lengths:
    """Scorer: logit = sequence length; pooled = [length, first id]. Records what it was sent."""

    def __init__(self):
        self.sent: list[int] = []

    async def score(self, inputs, *, want_pooled, deadline):
        self.sent.append(len(inputs))
        logits = np.asarray([len(i) for i in inputs.ids], np.float32)
        pooled = np.asarray([[len(i), i[0]] for i in inputs.ids], np.float32) if want_pooled else None
        return Scores(logits, pooled)

    async def ready(self, timeout):
        return True

    async def close(self):
        pass


def _inputs(*lengths):
    ids = [np.arange(n, dtype=np.int64) + 7 for n in lengths]
    return ModelInputs(ids, [np.zeros(n, np.int64) for n in lengths])


def test_repeated_sequences_are_scored_once_and_answered_alike():
    inner = Lengths()
    memo = MemoScorer(inner)
    first = asyncio.run(memo.score(_inputs(3, 5, 3), want_pooled=False, deadline=1e18))
    second = asyncio.run(memo.score(_inputs(5, 3, 9), want_pooled=False, deadline=1e18))
    assert first.logits.tolist() == [3, 5, 3] and second.logits.tolist() == [5, 3, 9]
    assert inner.sent == [2, 1]  # (3, 5) then only 9
    assert (memo.misses, memo.hits) == (3, 3)


def test_pooled_vectors_come_with_the_first_scoring_so_parade_after_maxp_scores_nothing_again():
    inner = Lengths()
    memo = MemoScorer(inner)
    plain = asyncio.run(memo.score(_inputs(4), want_pooled=False, deadline=1e18))
    scored = asyncio.run(memo.score(_inputs(4, 4), want_pooled=True, deadline=1e18))
    assert plain.pooled is None and inner.sent == [1]
    assert scored.pooled.tolist() == [[4, 7], [4, 7]]
