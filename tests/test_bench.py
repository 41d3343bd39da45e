"""The preprocessing benchmark runs, and (slow marker) meets its goal."""

from __future__ import annotations

import pytest
from keyrank.bench import CASES, run
from shared_data import DATASETS


def test_bench_measures_every_strategy_against_the_raw_tokenizer(prepared_models):
    result = run(prepared_models, DATASETS, n_docs=2, max_chars=8_000, repeats=1)
    assert result["document_tokens"] > 1_000
    assert len(result["strategies"]) == len(CASES)
    for row in result["strategies"].values():
        assert row["tokens_per_s"] > 0 and row["ratio_to_raw"] > 0
    assert result["segmentation_dp"]["speedup"] > 1


@pytest.mark.slow
def test_preprocessing_keeps_at_least_half_the_raw_tokenizer_speed(prepared_models):
    result = run(prepared_models, DATASETS, n_docs=20, max_chars=60_000, repeats=5)
    for name, row in result["strategies"].items():
        if "dense" not in name:  # the bi-encoder is a neural model, not preprocessing
            assert row["ratio_to_raw"] >= 0.5, (name, row)
