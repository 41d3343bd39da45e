"""The benchmarks run: preprocessing (its goal slow-marked), and `--gpu` on a machine without CUDA."""

from __future__ import annotations

import json
from pathlib import Path
import re

import numpy as np
import pytest
from keyrank.bench import CASES, run
from shared_data import DATASETS


def test_bench_measures_every_strategy_against_the_raw_tokenizer(prepared_models):
    result = run(prepared_models, DATASETS, n_docs=2, max_chars=8_000, repeats=1)
    assert result["document_tokens"] > 1_000
    assert len(result["strategies"]) == len(CASES)
    raw = result["raw_tokenizer_tokens_per_s"]
    for name, row in result["strategies"].items():
        # The figures are of one measurement: tokens/s from the median time, the ratio against the raw tokenizer's.
        assert row["tokens_per_s"] == pytest.approx(result["document_tokens"] / (row["ms"] / 1000), rel=1e-9), name
        assert row["ratio_to_raw"] == pytest.approx(row["tokens_per_s"] / raw, rel=1e-9), name
    # What was measured is the plan that is served: one sequence per document for firstp and keyb2, more for windows.
    sequences = {name: row["sequences"] for name, row in result["strategies"].items()}
    assert sequences["firstp"] == sequences["keyb2/bm25"] == sequences["keyb2/dense (cached)"] == result["documents"]
    assert sequences["maxp"] > sequences["avgp"] > result["documents"]
    assert result["segmentation_dp"]["speedup"] > 1


@pytest.mark.slow
def test_preprocessing_keeps_at_least_half_the_raw_tokenizer_speed(prepared_models):
    result = run(prepared_models, DATASETS, n_docs=20, max_chars=60_000, repeats=5)
    for name, row in result["strategies"].items():
        if "dense" not in name:  # the bi-encoder is a neural model, not preprocessing
            assert row["ratio_to_raw"] >= 0.5, (name, row)


def test_gpu_bench_without_cuda_measures_the_cpu_ceiling_and_says_the_gpu_parts_were_skipped(prepared_models, capsys, tmp_path):
    from keyrank.bench import main
    from keyrank.bench.gpu import SKIPPED, cuda_device

    if cuda_device() is not None:
        pytest.skip("a CUDA device is present: the GPU parts run (see docs/PERFORMANCE.md)")
    assert main(["--gpu", "--model-dir", str(prepared_models), "--datasets", str(DATASETS), "--docs", "8", "--workers", "1",
                 "--json", str(tmp_path / "gpu.json")]) == 0
    assert set(json.loads((tmp_path / "gpu.json").read_text())) == {"machine", "cpu", "skipped"}
    out = capsys.readouterr().out
    assert SKIPPED == "GPU parts skipped: no CUDA device" and SKIPPED in out
    for strategy in ("keyb2-bm25", "keyb2-blocks-bm25", "maxp", "firstp"):
        assert re.search(rf"{strategy}\s+[\d,]+ tokens/s\s+[\d.]+ q/s", out), out


def test_worker_processes_time_a_round_by_their_own_clocks_however_late_this_process_resumes(prepared_models):
    # A short round can end before the process that released it is scheduled again past the barrier; timed from
    # there, the preprocessing ceiling once read a negative wall time (firstp at -58,740 q/s on a loaded 2-core VM).
    import time

    from keyrank.bench.processes import WorkerProcesses
    from keyrank.bench.workloads import candidate_documents
    from keyrank.config import Settings
    from keyrank.pipeline import Pipeline, RerankOptions

    tokenizer = Pipeline.from_model_dir(Settings(model_dir=prepared_models)).tokenizer
    pool, queries = candidate_documents(DATASETS, tokenizer, 4, tokens=300)
    workers = WorkerProcesses(prepared_models, queries[0], pool, 4, 2, RerankOptions(strategy="firstp"), rounds=1)

    class LateBarrier:  # this process resumes 1 s after the workers are released
        def __init__(self, barrier):
            self.barrier = barrier

        def wait(self):
            self.barrier.wait()
            time.sleep(1.0)

    workers._barrier = LateBarrier(workers._barrier)
    try:
        wall, cpu = workers.round()
    finally:
        workers.close()
    assert 0 < wall < 1.0 and cpu > 0, (wall, cpu)


@pytest.mark.slow
def test_gpu_bench_http_and_baseline_parts_run_end_to_end_on_cpu(prepared_models, tmp_path, monkeypatch):
    # The GPU parts' HTTP harness and baseline, on this CPU: the GPU variant written for cpu/fp32,
    # served by the real embedded Triton behind `keyrank serve --workers 2`.
    from keyrank.bench import diy
    from keyrank.bench.gpu import end_to_end
    from keyrank.bench.workloads import candidate_documents
    from keyrank.config import Settings
    from keyrank.prepare.gpu_repository import REPOSITORY, write_gpu_repository
    from keyrank.pipeline import Pipeline
    from shared_data import CE_MODEL

    (tmp_path / "gateway").symlink_to((prepared_models / "gateway").resolve())
    manifest = json.loads((prepared_models / "gateway" / "manifest.json").read_text())
    write_gpu_repository(tmp_path, manifest["cross_encoder"], CE_MODEL, device="cpu", dtype="float32", max_batch_size=32)
    monkeypatch.setenv("KEYRANK_EMBEDDED_DEVICE", "cpu")
    tokenizer = Pipeline.from_model_dir(Settings(model_dir=prepared_models)).tokenizer
    pool, queries = candidate_documents(DATASETS, tokenizer, 6, tokens=300)
    http_rows: dict = {}
    saved: list[set] = []  # what was kept after each step: a run cut short keeps every row measured before
    http = end_to_end(tmp_path, queries, pool, candidates=3, requests=2, concurrency=2, duration_s=3, workers=2,
                      log_dir=tmp_path, device="cpu", strategies=(("keyb2", "bm25"), ("firstp", None)), bodies_per_case=2,
                      out=http_rows, saved=lambda: saved.append(set(http_rows["strategies"])))
    assert http is http_rows and set(http["strategies"]) == {"keyb2-bm25", "firstp", "keyb2-bm25 (seen before)"}
    assert saved == [set(), {"keyb2-bm25"}, {"keyb2-bm25", "firstp"}, set(http["strategies"])]
    for row in http["strategies"].values():
        assert 0 < row["latency"]["p50_ms"] <= row["latency"]["p99_ms"] and row["saturation"]["qps"] > 0
    baseline = diy.measure(tmp_path / REPOSITORY / "cross_encoder" / "1" / "checkpoint", "cpu", [(queries[0], pool[:3])] * 2)
    assert baseline["qps"] > 0


def test_query_bench_reports_the_median_round_as_queries_per_second_against_the_diy_baseline():
    from keyrank.bench import query

    seconds = {query.DIY: [40.0, 50.0, 45.0], "keyrank in-process, keyb2-bm25": [6.0, 5.0, 9.0]}
    rows = query.summarize(seconds, queries_per_round=2, reference=query.DIY)
    assert rows[query.DIY]["qps"] == pytest.approx(2 / 45.0) and rows[query.DIY]["vs_diy"] == 1.0
    assert rows["keyrank in-process, keyb2-bm25"]["qps"] == pytest.approx(2 / 6.0)
    assert rows["keyrank in-process, keyb2-bm25"]["vs_diy"] == pytest.approx(7.5)
    assert query.profile([{"infer": 10.0, "sequences": 100}, {"infer": 30.0, "sequences": 100}, {"infer": 20.0, "select": 4.0,
                                                                                                  "sequences": 100}]) == {
        "infer": 20.0, "select": 0.0, "sequences": 100.0}


def test_query_bench_quality_is_ndcg_at_10_of_the_eval_queries(monkeypatch):
    """The quality column ranks `keyrank eval`'s QMSum val queries and scores them with ir-measures: a system
    that ranks every query's relevant segment first gets 1.0, one that ranks it last less."""
    from keyrank.bench import query
    from keyrank.data import qmsum
    from keyrank.data.queries import Candidate, EvalQuery

    q = EvalQuery("q1", "budget", [Candidate(d, d) for d in ("a", "b", "c")], {"b": 1}, "0-512")
    monkeypatch.setattr(qmsum, "build", lambda *a, **k: [q])
    rows = query.quality({"oracle": lambda _q, docs: (np.array([t == "b" for t in docs], float), {}),
                          "worst": lambda _q, docs: (np.array([t != "b" for t in docs], float), {})}, DATASETS, None)
    assert rows["oracle"]["ndcg@10"] == 1.0 and rows["worst"]["ndcg@10"] == pytest.approx(0.5)


def test_query_bench_measures_the_quality_of_the_rows_named_and_refuses_one_not_measured(prepared_models, monkeypatch):
    from keyrank.bench import query

    monkeypatch.setattr(query, "keyrank_systems", lambda *a, **k: {
        "keyrank in-process, keyb2-blocks-bm25": lambda _q, docs: (np.zeros(len(docs)), {})})
    monkeypatch.setattr(query, "quality", lambda systems, *a, **k: {name: {"ndcg@10": 0.5, "queries": 1, "seconds": 0.0, "per_query": {}}
                                                                      for name in systems})
    monkeypatch.setattr("keyrank.bench.workloads.candidate_documents", lambda *a, **k: (["x"] * 4, ["q"]))
    result = query.run(prepared_models, DATASETS, Path("ckpt"), rounds=0, candidates=2, requests=1, diy=False,
                       quality_systems=["keyb2-blocks-bm25"], strategies=query.parse_systems(["keyb2-blocks-bm25"]))
    assert set(result["quality"]) == {"keyrank in-process, keyb2-blocks-bm25"}
    with pytest.raises(SystemExit, match="--quality-systems maxp"):
        query.run(prepared_models, DATASETS, Path("ckpt"), rounds=0, candidates=2, requests=1, diy=False,
                  quality_systems=["maxp"], strategies=query.parse_systems(["keyb2-blocks-bm25"]))


def test_query_bench_takes_any_registry_strategy_and_a_selecting_one_with_its_selector():
    from keyrank.bench import query

    assert query.parse_systems(["keyb2-bm25", "maxp", "cedr-knrm", "keyb2", "keyb2-dense", "model1"]) == (
        ("keyb2", "bm25"), ("maxp", None), ("cedr-knrm", None), ("keyb2", "bm25"), ("keyb2", "dense"), ("model1", None))
    with pytest.raises(SystemExit, match="lastp"):
        query.parse_systems(["lastp"])
    with pytest.raises(SystemExit, match="maxp-bm25"):
        query.parse_systems(["maxp-bm25"])
