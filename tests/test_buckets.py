"""Length buckets chosen per request: less padding than the fixed list, never more, same scores."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from keyrank.bench.workloads import dl20_requests
from keyrank.config import Settings
from keyrank.pipeline import Pipeline, RerankOptions
from keyrank.scoring import ModelInputs, bucket_batches
from keyrank.scoring.buckets import choose_edges, long_widths, padded_tokens, possible_widths
from keyrank.scoring.local import LocalScorer
from shared_data import DATASETS

FIXED = [64, 128, 256, 384, 512]


def _inputs(lengths) -> ModelInputs:
    ids = [np.arange(1, n + 1, dtype=np.int64) for n in lengths]
    return ModelInputs(ids, [np.zeros(n, dtype=np.int64) for n in lengths])


def test_adaptive_widths_never_pad_more_than_the_fixed_list():
    rng = np.random.default_rng(7)
    for _ in range(500):
        lengths = rng.integers(1, 513, size=int(rng.integers(1, 120)))
        for k, m in ((1, 32), (2, 32), (4, 32), (4, 16), (8, 64)):
            edges = choose_edges(lengths, FIXED, max_shapes=k, multiple=m)
            assert padded_tokens(lengths, edges) <= padded_tokens(lengths, np.asarray(FIXED))
            assert edges[-1] >= lengths.max()


def test_chosen_widths_are_the_cheapest_set_of_at_most_k_multiples():
    rng = np.random.default_rng(3)
    for _ in range(200):
        lengths = rng.integers(1, 513, size=int(rng.integers(1, 40)))
        k = int(rng.integers(1, 5))
        edges = choose_edges(lengths, [512], max_shapes=k, multiple=32)  # a one-width fixed list never wins
        assert len(edges) <= k and all(e % 32 == 0 for e in edges)
        candidates = np.unique(np.minimum(-(-lengths // 32) * 32, 512))
        best = min(
            padded_tokens(lengths, np.asarray(sorted(c) + [candidates[-1]]))
            for r in range(min(k, len(candidates)))
            for c in itertools.combinations(candidates[:-1], r)
        )
        assert padded_tokens(lengths, edges) == best


def test_batches_use_at_most_k_shapes_and_keep_every_row_in_place():
    rng = np.random.default_rng(11)
    lengths = rng.integers(20, 500, size=150)
    batches = bucket_batches(_inputs(lengths), buckets=FIXED, batch_size=32, pad_id=0, max_shapes=6, multiple=32)
    widths = {b.input_ids.shape[1] for b in batches}
    assert len(widths) <= 6 and all(w % 32 == 0 for w in widths) and widths != set(FIXED)
    rows = np.concatenate([b.rows for b in batches])
    assert sorted(rows.tolist()) == list(range(150))
    for b in batches:
        assert b.input_ids.shape[0] <= 32
        for r, row in enumerate(b.rows):
            n = lengths[row]
            assert b.attention_mask[r].sum() == n and (b.input_ids[r, :n] == np.arange(1, n + 1)).all()


def test_too_few_shapes_for_a_wide_spread_falls_back_to_the_fixed_list():
    # Three widths cannot cover 20..500 with less padding than five: the fixed list is kept.
    lengths = np.random.default_rng(11).integers(20, 500, size=150)
    batches = bucket_batches(_inputs(lengths), buckets=FIXED, batch_size=32, pad_id=0, max_shapes=3, multiple=32)
    assert {b.input_ids.shape[1] for b in batches} == set(FIXED)


def test_zero_shapes_keeps_the_fixed_buckets():
    lengths = [70, 130, 500]
    batches = bucket_batches(_inputs(lengths), buckets=FIXED, batch_size=32, pad_id=0, max_shapes=0)
    assert sorted(b.input_ids.shape[1] for b in batches) == [128, 256, 512]


def test_long_widths_cut_each_doubling_in_four_up_to_the_longest_input():
    assert long_widths(512, 8192) == (640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096,
                                      5120, 6144, 7168, 8192)
    assert long_widths(512, 5000)[-2:] == (4096, 5000)  # the model's own odd length is the last width
    assert long_widths(512, 512) == long_widths(512, 384) == ()  # a 512-token model: nothing past the buckets
    lengths = np.arange(513, 8193)
    edges = np.asarray(long_widths(512, 8192))
    assert np.max(edges[np.searchsorted(edges, lengths)] / lengths) < 1.25  # padding under a quarter


def test_long_sequences_travel_at_long_widths_in_batches_of_the_short_ones_tokens():
    lengths = [100, 300, 600, 3000, 3000, 3000, 8000]
    batches = bucket_batches(_inputs(lengths), buckets=FIXED, batch_size=4, pad_id=0, max_shapes=2, multiple=32,
                             long_buckets=long_widths(512, 8192))
    widths = sorted((b.input_ids.shape[1], b.rows.size) for b in batches)
    # short ones as before (at most 2 chosen widths); 3072 holds 4 x 512 // 3072 = 1 row, 8192 one
    assert len({w for w, _ in widths if w <= 512}) <= 2
    assert [(w, n) for w, n in widths if w > 512] == [(640, 1), (3072, 1), (3072, 1), (3072, 1), (8192, 1)]
    rows = np.concatenate([b.rows for b in batches])
    assert sorted(rows.tolist()) == list(range(len(lengths)))
    with pytest.raises(ValueError, match=r"1\.\.512"):
        bucket_batches(_inputs([600]), buckets=FIXED, batch_size=4, pad_id=0)  # no long widths: refused as before


def test_warm_up_covers_the_long_widths_and_not_every_multiple_past_512():
    widths = possible_widths(FIXED, max_shapes=4, multiple=32, max_length=4096)
    assert widths == tuple(range(32, 513, 32)) + long_widths(512, 4096)
    assert possible_widths(FIXED, max_shapes=4, multiple=32, max_length=512) == tuple(range(32, 513, 32))


@pytest.fixture(scope="module")
def pipeline(prepared_models: Path) -> Pipeline:
    return Pipeline.from_model_dir(Settings(model_dir=prepared_models, document_cache_bytes=0))


def test_firstp_on_short_passages_sends_a_fifth_fewer_tokens_than_fixed_buckets(pipeline):
    # DL20 BM25 top-100 passages (~100 tokens): the fixed list pads most of them to 128 or 256.
    fixed = adaptive = real = 0
    for query, docs in dl20_requests(DATASETS, 5):
        inputs = pipeline.plan(query, docs, RerankOptions(strategy="firstp")).inputs
        lengths = np.fromiter((len(i) for i in inputs.ids), dtype=np.int64)
        real += int(lengths.sum())
        fixed += padded_tokens(lengths, np.asarray(FIXED))
        adaptive += padded_tokens(lengths, choose_edges(lengths, FIXED, max_shapes=4, multiple=32))
    assert adaptive <= 0.85 * fixed, (real, fixed, adaptive)
    assert adaptive - real <= 0.5 * (fixed - real)  # at least half the padding is gone


def test_scores_do_not_depend_on_the_bucketing(prepared_models, pipeline):
    query, docs = dl20_requests(DATASETS, 1)[0]
    short = pipeline.plan(query, docs[:40], RerankOptions(strategy="firstp")).inputs
    longer = pipeline.plan(query, [" ".join(docs[i : i + 4]) for i in range(0, 24, 4)], RerankOptions(strategy="firstp")).inputs
    inputs = short + longer
    onnx = prepared_models / "triton" / "cross_encoder" / "1" / "model.onnx"
    pad = pipeline.template.pad_id
    fixed = LocalScorer(onnx, pad_id=pad, buckets=FIXED, threads=2).score_sync(inputs, want_pooled=True)
    fixed_widths = {b.input_ids.shape[1] for b in bucket_batches(inputs, buckets=FIXED, batch_size=32, pad_id=pad)}
    for k, m in ((4, 32), (6, 16), (8, 64)):
        scorer = LocalScorer(onnx, pad_id=pad, buckets=FIXED, threads=2, max_shapes=k, multiple=m)
        widths = {b.input_ids.shape[1] for b in bucket_batches(inputs, buckets=FIXED, batch_size=32, pad_id=pad, max_shapes=k, multiple=m)}
        assert widths != fixed_widths  # the scores below really came from other shapes
        adaptive = scorer.score_sync(inputs, want_pooled=True)
        np.testing.assert_allclose(adaptive.logits, fixed.logits, atol=1e-4)
        np.testing.assert_allclose(adaptive.pooled, fixed.pooled, atol=1e-4)
