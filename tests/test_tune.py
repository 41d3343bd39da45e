"""`keyrank tune`: the choice rule, and a whole run on judged TREC files with the real model."""

from __future__ import annotations

import json

import pytest
from keyrank.config import Settings
from keyrank.evaluation import tune
from toy_judged import toy_trec

QIDS = [f"q{i}" for i in range(12)]


def _scores(mean: float, spread: float) -> dict[str, float]:
    return {q: mean + (spread if i % 2 else -spread) for i, q in enumerate(QIDS)}


def test_the_cheapest_system_not_measurably_worse_than_the_best_wins():
    scores = {
        "best": _scores(0.80, 0.05),
        "tied": {q: v - (0.10 if i == 0 else 0.0) for i, (q, v) in enumerate(_scores(0.80, 0.05).items())},  # one query worse
        "worse": _scores(0.50, 0.01),  # cheapest, but worse on every query
    }
    cost = {"best": 3000.0, "tied": 500.0, "worse": 100.0}
    winner, diffs = tune.choose(scores, cost)
    assert winner == "tied"
    assert diffs["worse"][2] < 0 <= diffs["tied"][2]
    assert tune.choose(scores, cost, prefer="quality")[0] == "best"


def test_keyb2_variants_are_tried_per_selector_and_named_settings_only():
    systems = tune.candidates(["firstp", "keyb2"], ["bm25", "dense"], ["", "keyb2_budget=fill"])
    assert [c.name for c in systems] == ["firstp", "keyb2-bm25", "keyb2-bm25 keyb2_budget=fill", "keyb2-dense",
                                         "keyb2-dense keyb2_budget=fill"]
    assert systems[2].env() == {"KEYRANK_DEFAULT_STRATEGY": "keyb2", "KEYRANK_DEFAULT_SELECTOR": "bm25",
                                "KEYRANK_KEYB2_BUDGET": "fill"}
    with pytest.raises(SystemExit, match="not a setting"):
        tune.parse_variant("keyb2_budgett=fill")


def test_windows_strategies_are_tried_with_each_window_variant():
    systems = tune.candidates(["maxp", "firstp", "parade-avg"], ["bm25"], [""], ["", "max_windows_per_doc=3"])
    assert [c.name for c in systems] == ["maxp", "maxp max_windows_per_doc=3", "firstp", "parade-avg",
                                         "parade-avg max_windows_per_doc=3"]
    assert systems[1].env() == {"KEYRANK_DEFAULT_STRATEGY": "maxp", "KEYRANK_MAX_WINDOWS_PER_DOC": "3"}
    assert tune.parser().parse_args(["--qrels", "q", "--docs", "d", "--queries", "t"]).windows == list(tune.WINDOW_VARIANTS)
    blocks = tune.candidates(["keyb2-blocks"], ["bm25", "dense"], ["", "keyb2_budget=fill"], [""])
    assert [c.name for c in blocks] == ["keyb2-blocks-bm25", "keyb2-blocks-dense"]  # keyb2's variants do not apply
    with pytest.raises(SystemExit, match="--windows 'max_window=3'"):
        tune.candidates(["maxp"], ["bm25"], [""], ["max_window=3"])


def test_queries_without_a_relevant_candidate_are_refused_with_the_reason(prepared_models, tmp_path):
    qrels, docs, queries = toy_trec(tmp_path)
    qrels.write_text("".join(line.rsplit(" ", 1)[0] + " 0\n" for line in qrels.read_text().splitlines()))
    with pytest.raises(SystemExit, match="nothing to measure"):
        tune.main(["--qrels", str(qrels), "--docs", str(docs), "--queries", str(queries), "--model-dir", str(prepared_models),
                   "--out", str(tmp_path / "t")])


def test_tune_ranks_systems_on_trec_files_and_writes_an_env_file_that_serve_reads(prepared_models, tmp_path, monkeypatch):
    qrels, docs, queries = toy_trec(tmp_path)
    out = tmp_path / "tune"
    code = tune.main(["--qrels", str(qrels), "--docs", str(docs), "--queries", str(queries), "--model-dir", str(prepared_models),
                      "--strategies", "firstp", "keyb2", "--selectors", "bm25", "--keyb2", "", "keyb2_budget=fill",
                      "--out", str(out), "--no-progress"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    rows = results["systems"]
    assert set(rows) == {"firstp", "keyb2-bm25", "keyb2-bm25 keyb2_budget=fill"}
    assert results["queries"] == 12 and all(r["failed_queries"] == 0 for r in rows.values())
    # The answer sits past token 512 of the relevant document: firstp never reads it, keyb2 selects it.
    assert rows["keyb2-bm25"]["nDCG@10"] > rows["firstp"]["nDCG@10"] + 0.1
    # The winner is what the rule picks from the table written beside it.
    best = max(rows, key=lambda s: rows[s]["nDCG@10"])
    tied = [s for s, r in rows.items() if r["interval"][1] >= 0]
    assert best in tied and results["winner"] == min(tied, key=lambda s: (rows[s]["tokens_per_query"], -rows[s]["nDCG@10"]))
    env_file = out / "keyrank.env"
    served = Settings(_env_file=env_file)
    assert f"{served.default_strategy}" == results["env"]["KEYRANK_DEFAULT_STRATEGY"]
    assert "(chosen)" in (out / "report.md").read_text()


def test_serve_reads_the_tuned_env_file_under_the_environment(tmp_path, monkeypatch):
    from keyrank.config import get_settings

    env_file = tmp_path / "keyrank.env"
    env_file.write_text("# keyrank tune\nKEYRANK_DEFAULT_STRATEGY=maxp\nKEYRANK_KEYB2_BUDGET=fill\n")
    monkeypatch.setenv("KEYRANK_ENV_FILE", str(env_file))
    monkeypatch.setenv("KEYRANK_KEYB2_BUDGET", "paper480")  # the environment wins over the file
    get_settings.cache_clear()
    try:
        settings = get_settings()
        assert (settings.default_strategy, settings.keyb2_budget) == ("maxp", "paper480")
        monkeypatch.setenv("KEYRANK_ENV_FILE", str(tmp_path / "missing.env"))
        get_settings.cache_clear()
        with pytest.raises(ValueError, match="no such file"):
            get_settings()
    finally:
        get_settings.cache_clear()


def test_eval_measures_strategies_on_the_users_trec_files(prepared_models, tmp_path):
    from keyrank.evaluation.cli import main as eval_main

    qrels, docs, queries = toy_trec(tmp_path)
    out = tmp_path / "eval"
    eval_main(["--task", "trec", "--qrels", str(qrels), "--docs", str(docs), "--queries", str(queries),
               "--model-dir", str(prepared_models), "--scorer", "local", "--strategies", "firstp", "keyb2",
               "--selectors", "bm25", "--out", str(out), "--no-progress"])
    systems = json.loads((out / "results.json").read_text())["trec"]["systems"]
    assert systems["keyb2-bm25"]["metrics"]["nDCG@10"] > systems["firstp"]["metrics"]["nDCG@10"] + 0.1
    assert "scored by the fused (ONNX Runtime) CPU model in-process (--scorer local)" in (out / "report.md").read_text()
    with pytest.raises(SystemExit, match="give --qrels, --docs and --queries"):
        eval_main(["--task", "trec", "--model-dir", str(prepared_models)])
