"""The redesign of the request path (one plan, rooms by lifecycle) changed no score.

``golden/scores.json`` holds the scores, evidence and token counts of one fixed request on every
strategy and selector, made by ``golden/make_scores.py`` on the commit before the redesign (08bba45)
with the real cross-encoder; this runs the same request through today's code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "golden"


def _load_maker():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_scores", HERE / "make_scores.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_strategy_and_selector_scores_the_fixed_request_as_before_the_redesign(prepared_models):
    golden = json.loads((HERE / "scores.json").read_text())
    now = _load_maker().scores(str(prepared_models))
    assert set(now) == set(golden)
    for case, expected in golden.items():
        got = now[case]
        assert got["evidence"] == expected["evidence"], case
        assert got["scored_tokens"] == expected["scored_tokens"], case
        for index, score in expected["scores"].items():
            assert got["scores"][index] == pytest.approx(score, abs=1e-4), (case, index)
