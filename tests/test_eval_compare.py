"""`python -m keyrank.evaluation.compare`: the tables of docs/EVALUATION.md come from the runs' own files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keyrank.evaluation.compare import load, main, merged_report, paired_difference


def _system(ndcg: float, by_bucket: dict[str, float]) -> dict:
    return {"metrics": {"nDCG@10": ndcg, "RR@10": ndcg, "R@5": 1.0}, "psi": {"nDCG@10": 0.1},
            "cost": {"scored_tokens": 1000.0}, "errors": 0,
            "by_bucket": {b: {"nDCG@10": v} for b, v in by_bucket.items()}}


def _run(folder: Path, per_query: dict[str, dict[str, float]], far: dict[str, float] | None = None) -> Path:
    folder.mkdir()
    (folder / "runs").mkdir()
    systems = {s: _system(sum(v.values()) / len(v), {"all": sum(v.values()) / len(v)}) for s, v in per_query.items()}
    results = {"qmsum": {"queries": 4, "candidates_per_query": 9.0, "buckets": {"all": 4},
                         "random": {"metrics": {"nDCG@10": 0.5}, "by_bucket": {"all": {"nDCG@10": 0.5}}}, "systems": systems}}
    if far:
        results["farrel"] = {"queries": 2, "candidates_per_query": 10.0, "buckets": {"0": 1, "3072": 1},
                             "random": {"metrics": {"nDCG@10": 0.4}, "by_bucket": {"0": {"nDCG@10": 0.4}, "3072": {"nDCG@10": 0.4}}},
                             "systems": {"keyb2-bm25": {**_system(0.6, far), "psi_noise": {
                                 "psi": 0.5, "interval": [0.3, 0.7], "blind_median": 0.08, "blind_95": 0.12, "p": 0.001}}}}
        results["farrel-bare"] = {"queries": 1, "candidates_per_query": 10.0, "buckets": {"bare": 1},
                                  "random": {"metrics": {"nDCG@10": 0.4}, "by_bucket": {"bare": {"nDCG@10": 0.4}}},
                                  "systems": {"keyb2-bm25": _system(0.8, {"bare": 0.8})}}
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "runs" / "qmsum.json").write_text(json.dumps(
        {"per_query": {s: {q: {"nDCG@10": x} for q, x in v.items()} for s, v in per_query.items()}}))
    return folder


def test_paired_difference_is_the_mean_over_shared_queries_and_its_interval_holds_it():
    a = {"q1": 0.9, "q2": 0.5, "q3": 0.7, "only-a": 1.0}
    b = {"q1": 0.6, "q2": 0.6, "q3": 0.4, "only-b": 0.0}
    mean, low, high, n = paired_difference(a, b)
    assert n == 3 and mean == pytest.approx((0.3 - 0.1 + 0.3) / 3)
    assert low <= mean <= high and low >= -0.1 - 1e-9 and high <= 0.3 + 1e-9
    assert paired_difference({"q": 0.7, "r": 0.2}, {"q": 0.5, "r": 0.0})[1:3] == pytest.approx((0.2, 0.2))


def test_tables_diffs_and_bare_ratios_come_from_the_run_folders(tmp_path, capsys):
    base = _run(tmp_path / "base", {"maxp": {"q1": 0.5, "q2": 0.7, "q3": 0.6, "q4": 0.6}})
    ft = _run(tmp_path / "ft", {"keyb2-bm25": {"q1": 0.8, "q2": 0.8, "q3": 0.7, "q4": 0.7}}, far={"0": 0.8, "3072": 0.4})
    assert main([f"base={base}", f"ft={ft}", "--diff", "ft:keyb2-bm25", "base:maxp"]) == 0
    out = capsys.readouterr().out
    assert "| maxp | base | 0.600 |" in out and "| keyb2-bm25 | ft | 0.750 |" in out
    assert "| ft:keyb2-bm25 - base:maxp | +0.150 |" in out
    # far-relevant: 0.8 / 0.8 at offset 0, 0.4 / 0.8 at 3072; the worst offset is the verdict
    assert "| keyb2-bm25 | ft | 0.800 | 1.00 | 0.50 | 0.50 | 0.500 [0.300, 0.700] | 0.120 | 0.001 |" in out
    with pytest.raises(SystemExit, match="no system 'parade-attn'"):
        main([f"base={base}", "--diff", "base:parade-attn", "base:maxp"])


def test_plot_draws_every_label_and_system_of_the_runs_as_one_point(tmp_path, capsys):
    k2 = _run(tmp_path / "k2", {"keyb2-blocks-bm25": {"q1": 0.5, "q2": 0.7, "q3": 0.6, "q4": 0.6}})
    k8 = _run(tmp_path / "k8", {"keyb2-blocks-bm25": {"q1": 0.8, "q2": 0.8, "q3": 0.7, "q4": 0.7},
                                "maxp": {"q1": 0.6, "q2": 0.6, "q3": 0.6, "q4": 0.6}})
    assert main([f"k2={k2}", f"k8={k8}", "--plot", str(tmp_path / "fig")]) == 0
    figure = tmp_path / "fig" / "qmsum_quality_vs_cost.png"
    assert f"wrote {figure}" in capsys.readouterr().out
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = merged_report([load(f"k2={k2}"), load(f"k8={k8}")], "qmsum")
    assert sorted(report["systems"]) == ["k2:keyb2-blocks-bm25", "k8:keyb2-blocks-bm25", "k8:maxp"]
    assert report["systems"]["k8:keyb2-blocks-bm25"]["metrics"]["nDCG@10"] == pytest.approx(0.75)
    assert merged_report([load(f"k2={k2}")], "farrel") is None
    assert sorted(merged_report([load(f"k8={k8}")], "qmsum", drop=["k8:maxp"])["systems"]) == ["k8:keyb2-blocks-bm25"]
