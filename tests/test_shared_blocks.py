"""Text the other candidates share is not evidence: keyb2 with ``keyb2_shared_share`` does not choose by score a
block that most other candidates of the request also contain, wherever it sits and however it is cut."""

from __future__ import annotations

import numpy as np
import pytest
from keyrank.config import Settings
from keyrank.segment import Spans
from keyrank.select import REGISTRY as SELECTORS
from keyrank.select.shared import shared_blocks
from keyrank.strategies.keyb2 import keyb2_passages
from keyrank.tokenize import Encoded

RNG = np.random.default_rng(7)
PLANTED = RNG.integers(1000, 30000, 40)  # the passage every candidate carries


def _doc(before: int, after: int, planted: bool = True) -> np.ndarray:
    parts = [RNG.integers(1000, 30000, before)] + ([PLANTED] if planted else []) + [RNG.integers(1000, 30000, after)]
    return np.concatenate(parts).astype(np.int64)


def _blocks(n: int, size: int) -> Spans:
    starts = np.arange(0, n, size, dtype=np.int64)
    return Spans(starts, np.minimum(starts + size, n))


def test_a_passage_most_candidates_carry_is_shared_wherever_it_sits_and_however_it_is_cut():
    docs = [_doc(0, 60), _doc(17, 43), _doc(33, 27), _doc(50, 10, planted=False)]
    blocks = [_blocks(len(d), 20) for d in docs]
    shared = shared_blocks(docs, blocks, 0.5)
    for d, (ids, spans, flags) in enumerate(zip(docs, blocks, shared)):
        start = next((i for i in range(len(ids) - 39) if np.array_equal(ids[i:i + 40], PLANTED)), None)
        for b, (s, e) in enumerate(zip(spans.starts, spans.ends)):
            inside = 0 if start is None else max(0, min(e, start + 40) - max(s, start))
            if inside == e - s:  # wholly the planted passage
                assert flags[b], (d, b)
            if inside == 0:  # none of it
                assert not flags[b], (d, b)
    assert not shared[3].any()  # the candidate without it shares nothing


def test_nothing_is_shared_among_fewer_than_three_candidates_or_below_the_share():
    docs = [_doc(0, 60), _doc(17, 43)]
    assert not any(f.any() for f in shared_blocks(docs, [_blocks(len(d), 20) for d in docs], 0.5))
    docs = [_doc(0, 60), _doc(17, 43)] + [_doc(30, 30, planted=False) for _ in range(4)]
    # the passage is in 1 of the 5 other candidates of each carrier: under a share of 0.5, over one of 0.2
    assert not any(f.any() for f in shared_blocks(docs, [_blocks(len(d), 20) for d in docs], 0.5))
    assert shared_blocks(docs, [_blocks(len(d), 20) for d in docs], 0.2)[0].any()
    with pytest.raises(ValueError, match="share"):
        shared_blocks(docs, [_blocks(len(d), 20) for d in docs], 0.0)


def test_keyb2_reads_a_candidates_own_block_instead_of_the_text_every_candidate_carries():
    docs = [_doc(0, 60), _doc(20, 40), _doc(40, 20)]
    blocks = [_blocks(len(d), 20) for d in docs]
    scores = []
    for ids, spans in zip(docs, blocks):
        s = np.ones(len(spans))
        for b, (start, end) in enumerate(zip(spans.starts, spans.ends)):
            if np.isin(ids[start:end], PLANTED).all():
                s[b] = 10.0  # the selector likes the planted passage best in every candidate
        scores.append(s)
    encoded = [Encoded(ids=d, offsets=np.zeros((len(d), 2), dtype=np.int32), text="") for d in docs]
    plain = Settings(keyb2_budget_tokens=20, keyb2_min_score_share=None)
    skip = plain.with_overrides(keyb2_shared_share=0.5)
    for d, (before, after) in enumerate(zip(keyb2_passages(encoded, blocks, scores, 20, plain, selector=SELECTORS["bm25"]),
                                            keyb2_passages(encoded, blocks, scores, 20, skip, selector=SELECTORS["bm25"]))):
        assert scores[d][before.pieces].max() == 10.0  # without the rule: the planted passage in each
        assert scores[d][after.pieces].max() == 1.0, d  # with it: a block of the candidate's own
    # a candidate made only of shared text is read as without the rule
    only = [_doc(0, 0)] * 3
    kept = keyb2_passages([Encoded(ids=d, offsets=np.zeros((40, 2), dtype=np.int32), text="") for d in only],
                          [_blocks(40, 20)] * 3, [np.array([2.0, 1.0])] * 3, 20, skip, selector=SELECTORS["bm25"])
    assert all(len(p.pieces) for p in kept)
