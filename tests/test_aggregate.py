"""Each aggregation on known scores."""

from __future__ import annotations

import numpy as np
import pytest
from keyrank.aggregate import ClassifierHead, aggregate

DOC_OF = np.array([0, 0, 0, 1, 2, 2])
LOGITS = np.array([1.0, 3.0, 2.0, -1.0, 0.5, 0.25])


def test_max_takes_the_best_window_and_points_evidence_at_it():
    out = aggregate("max", DOC_OF, LOGITS)
    assert out.scores.tolist() == [3.0, -1.0, 0.5]
    assert out.best.tolist() == [1, 3, 4]


def test_sum_and_mean():
    assert aggregate("sum", DOC_OF, LOGITS).scores.tolist() == [6.0, -1.0, 0.75]
    assert aggregate("mean", DOC_OF, LOGITS).scores.tolist() == [2.0, -1.0, 0.375]


def test_log_sum_exp_is_a_soft_max_that_never_overflows_and_points_evidence_at_the_best():
    out = aggregate("lse", DOC_OF, LOGITS)
    np.testing.assert_allclose(out.scores, [np.log(np.e + np.e**3 + np.e**2), -1.0, np.log(np.exp(0.5) + np.exp(0.25))])
    assert out.best.tolist() == [1, 3, 4]
    assert np.all(out.scores >= aggregate("max", DOC_OF, LOGITS).scores)  # never below the best sequence
    np.testing.assert_allclose(aggregate("lse", DOC_OF, LOGITS + 900.0).scores, out.scores + 900.0)  # exp(900) = inf
    # A second strong sequence lifts a document; a weak one hardly does.
    two_strong, one_strong = (aggregate("lse", np.array([0, 0]), np.array(v)).scores[0] for v in ([3.0, 3.0], [3.0, -3.0]))
    assert two_strong == pytest.approx(3.0 + np.log(2)) and 3.0 < one_strong < 3.003


def test_single_needs_one_sequence_per_document():
    assert aggregate("single", np.array([0, 1]), np.array([0.2, 0.1])).scores.tolist() == [0.2, 0.1]
    with pytest.raises(ValueError):
        aggregate("single", DOC_OF, LOGITS)


def test_parade_max_and_avg_apply_the_head_to_folded_pooled_vectors():
    pooled = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    head = ClassifierHead(weight=np.array([[1.0, -1.0]]), bias=np.array([0.5]))
    parade_max = aggregate("parade-max", DOC_OF, LOGITS, pooled, head).scores
    # doc 0: max -> [3, 2] -> 3 - 2 + 0.5; doc 1: [1, 1] -> 0.5; doc 2: [2, 2] -> 0.5
    np.testing.assert_allclose(parade_max, [1.5, 0.5, 0.5])
    parade_avg = aggregate("parade-avg", DOC_OF, LOGITS, pooled, head).scores
    # doc 0: mean -> [4/3, 1] -> 1/3 + 0.5
    np.testing.assert_allclose(parade_avg, [1 / 3 + 0.5, 0.5, 0.5])


def test_sequences_must_come_grouped_by_document():
    with pytest.raises(ValueError):
        aggregate("max", np.array([0, 1, 0]), np.array([1.0, 2.0, 3.0]))
