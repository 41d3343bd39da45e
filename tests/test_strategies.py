"""Strategy inputs: what the model reads for each document."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from keyrank.segment import Spans
from keyrank.template import InputTemplate
from keyrank.strategies.firstp import first_passage
from keyrank.strategies.keyb2 import select_blocks
from keyrank.tokenize import TextTokenizer
from shared_data import CE_MODEL

TOKENIZER = TextTokenizer.from_file(CE_MODEL / "tokenizer.json")


def _spans(lengths):
    ends = np.cumsum(lengths).astype(np.int64)
    return Spans(ends - np.asarray(lengths, dtype=np.int64), ends)


@given(st.lists(st.integers(1, 63), min_size=1, max_size=80), st.integers(1, 600), st.data())
def test_keyb2_never_exceeds_the_budget_and_restores_document_order(lengths, budget, data):
    scores = np.asarray(data.draw(st.lists(st.floats(-5, 5), min_size=len(lengths), max_size=len(lengths))))
    spans = _spans(lengths)
    passage = select_blocks(0, spans, scores, budget)
    assert passage.n_tokens == min(budget, sum(lengths))
    assert np.all(np.diff(passage.starts) > 0)  # document order
    assert np.all(passage.ends > passage.starts)
    # The blocks kept whole are the top-scored ones: no left-out block outscores a kept one.
    kept = set(passage.pieces.tolist())
    dropped = [i for i in range(len(lengths)) if i not in kept]
    if dropped and kept:
        assert max(scores[dropped]) <= min(scores[sorted(kept)])


def test_keyb2_truncates_only_the_last_block_taken():
    spans = _spans([10, 10, 10, 10])
    passage = select_blocks(0, spans, np.array([0.1, 0.9, 0.5, 0.7]), budget=25)
    # Taken by score: block 1 (10), block 3 (10), block 2 (5 of 10); back in document order.
    assert passage.pieces.tolist() == [1, 2, 3]
    assert (passage.ends - passage.starts).tolist() == [10, 5, 10]
    assert passage.starts.tolist() == [10, 20, 30]


def test_firstp_never_sees_text_after_the_budget():
    passage = first_passage(0, n_tokens=5000, budget=477)
    assert passage.starts.tolist() == [0] and passage.ends.tolist() == [477]


BERT = InputTemplate.bert(cls_id=101, sep_id=102, pad_id=0)


def test_bert_template_frames_cls_query_sep_passage_sep_with_token_types():
    query = TOKENIZER.encode_query("what is keyb2", 32)
    doc = TOKENIZER.encode_documents(["first block. second block. third block."])[0]
    passage = select_blocks(0, _spans([3, 3, 3]), np.array([0.0, 1.0, 2.0]), budget=6)
    ids, types = BERT.build(query.ids, doc.ids, passage.starts, passage.ends)
    assert ids.tolist() == [101, *query.ids, 102, *doc.ids[3:9], 102]
    assert types.tolist() == [0] * (len(query) + 2) + [1] * 7


def test_bert_budget_is_512_minus_3_minus_the_query_so_every_sequence_fits():
    assert BERT.document_budget(32) == 477
    assert BERT.document_budget(29) == 480  # the paper's 480 holds for a 29-token query only
    query, doc = np.arange(1000, 1032), np.arange(2000, 2600)
    ids, _ = BERT.build(query, doc, [0], [BERT.document_budget(32)])
    assert len(ids) == 512  # the budget fills the model's length exactly, frame included
    assert BERT.document_budget(32, max_length=256) == 221


def _lead_trimmed_by_slices(passages, docs, anchors, lead):
    """lead_trimmed as it was first written: each input's tokens compared with the anchors, input by input."""
    from keyrank.strategies.keyb2 import started_at

    anchors = np.asarray(anchors, dtype=np.int64)[:, None]
    out = []
    for p in passages:
        start = int(p.starts[0]) if len(p.starts) else 0
        if start > 0:
            hits = np.flatnonzero((docs[p.doc].ids[start:int(p.ends[-1])] == anchors).any(axis=0))
            if hits.size and hits[0] > lead:
                p = started_at(p, start + int(hits[0]) - lead)
        out.append(p)
    return out


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_lead_trimming_equals_comparing_each_input_with_the_anchors(data):
    from keyrank.strategies.keyb2 import key_block_passages, lead_trimmed
    from keyrank.tokenize import Encoded

    vocab = data.draw(st.integers(3, 40))  # few ids: anchors are often there, several times, at block edges
    docs, pieces, scores = [], [], []
    for _ in range(data.draw(st.integers(1, 4))):
        ids = np.asarray(data.draw(st.lists(st.integers(0, vocab), max_size=120)), dtype=np.int64)
        cuts = sorted(set(data.draw(st.lists(st.integers(1, max(len(ids) - 1, 1)), max_size=12))) - {len(ids)})
        bounds = np.asarray([0, *cuts, len(ids)] if len(ids) else [0], dtype=np.int64)
        docs.append(Encoded(ids=ids, offsets=np.zeros((len(ids), 2), np.int32), text=""))
        pieces.append(Spans(bounds[:-1], bounds[1:]))
        scores.append(np.asarray(data.draw(st.lists(st.floats(0, 3), min_size=len(bounds) - 1, max_size=len(bounds) - 1))))
    passages = key_block_passages(pieces, scores, data.draw(st.integers(1, 6)), data.draw(st.integers(1, 4)))
    anchors = data.draw(st.lists(st.integers(0, vocab + 5), min_size=1, max_size=4, unique=True))
    lead = data.draw(st.integers(0, 6))
    ours, theirs = lead_trimmed(passages, docs, anchors, lead), _lead_trimmed_by_slices(passages, docs, anchors, lead)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.doc == b.doc
        for field in ("starts", "ends", "pieces"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
