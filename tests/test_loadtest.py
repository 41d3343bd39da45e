"""The load test sends realistic, valid requests and its runner reports honestly.

Offline: the QMSum payloads have the documented shape and hold their evidence,
every strategy has a locust user class, the bodies pass the service's own
request schema, and the runner exits non-zero when requests fail. Live (marked
triton): a bounded locust run against a gateway on the embedded Triton has zero
failures. The `gateway_url` fixture (conftest.py) is that gateway's base URL.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import serve_gateway

ROOT = Path(__file__).resolve().parents[1]
LOADTEST = ROOT / "loadtest"
DATASETS = Path(os.environ.get("LOADTEST_DATASETS", ROOT / ".." / "shared" / "datasets"))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"loadtest_{name}", LOADTEST / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


payloads = _load("payloads")


@pytest.fixture(scope="module")
def default_payloads():
    if not (DATASETS / "qmsum").is_dir():
        pytest.skip(f"QMSum not found under {DATASETS}")
    config = payloads.LoadConfig.from_env({"LOADTEST_DATASETS": str(DATASETS)})
    return config, payloads.build_payloads(config)


def run_runner(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, LOADTEST_DATASETS=str(DATASETS))
    return subprocess.run([sys.executable, str(LOADTEST / "run.py"), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


# --- payloads ---------------------------------------------------------------------------------


def test_default_payloads_are_64_candidates_of_1_to_3k_tokens(default_payloads):
    config, built = default_payloads
    assert len(built) == config.payloads == 16
    for payload in built:
        assert len(payload.documents) == 64
        assert len({d.id for d in payload.documents}) == 64
        tokens = [d.words * payloads.TOKENS_PER_WORD for d in payload.documents]
        # a passage ends at the first turn boundary past its target: one long turn may overshoot a little
        assert min(tokens) >= 1000 and max(tokens) <= 3000 * 1.15
        assert sum(tokens) / len(tokens) > 1500


def test_each_payload_holds_the_passage_with_its_evidence_and_hard_negatives(default_payloads):
    config, built = default_payloads
    meetings = {m.name: m for m in payloads.load_meetings(config.datasets, config.split)}
    with_hard_negatives = 0
    for payload in built:
        relevant = next(d for d in payload.documents if d.id == payload.relevant_id)
        meeting = meetings[relevant.meeting]
        first_evidence = next(first for query, first, _ in meeting.queries if query == payload.query)
        assert relevant.first_turn <= first_evidence <= relevant.last_turn
        assert meeting.turns[first_evidence] in relevant.text
        same_meeting = sorted((d.first_turn, d.last_turn) for d in payload.documents if d.meeting == relevant.meeting)
        assert all(a[1] < b[0] for a, b in zip(same_meeting, same_meeting[1:])), "passages never overlap"
        with_hard_negatives += len(same_meeting) > 1
    # the meeting's other passages are the hard negatives (a short meeting has none)
    assert with_hard_negatives >= len(built) // 2


def test_payloads_are_reproducible_for_a_seed_and_differ_across_seeds(default_payloads):
    config, built = default_payloads
    again = payloads.build_payloads(config)
    assert [(p.query, [d.id for d in p.documents]) for p in again] == [(p.query, [d.id for d in p.documents]) for p in built]
    other = payloads.build_payloads(payloads.LoadConfig.from_env({"LOADTEST_DATASETS": str(DATASETS), "LOADTEST_SEED": "1"}))
    assert [p.query for p in other] != [p.query for p in built]


def test_request_bodies_pass_the_services_request_schema(default_payloads):
    from keyrank.schemas import RerankRequest

    config, built = default_payloads
    for scenario, (strategy, selector) in payloads.SCENARIOS.items():
        body = payloads.rerank_body(built[0], scenario, config.top_n)
        request = RerankRequest.model_validate(body)  # extra="forbid": a stray field fails here
        assert request.strategy == strategy and request.selector == selector
        assert len(request.documents) == 64 and request.top_n == 10


# --- locustfile and runner ----------------------------------------------------------------------


def test_every_strategy_has_its_own_locust_user_class():
    listed = subprocess.run([sys.executable, "-m", "locust", "-f", str(LOADTEST / "locustfile.py"), "--list"],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    classes = {line.strip() for line in listed.stdout.splitlines()[1:] if line.strip()}
    assert classes == {payloads.user_class_name(s) for s in payloads.SCENARIOS}
    assert len(classes) == 10  # one per scenario; keyb2-blocks, the default, is the tenth


def test_runner_exits_nonzero_and_reports_failures_when_the_service_is_unreachable(tmp_path):
    # port 9 (discard) has no listener here: every request fails to connect
    result = run_runner("--host", "http://127.0.0.1:9", "--strategies", "keyb2", "--users", "1", "--run-time", "2s",
                        "--stop-timeout", "1", "--docs-per-query", "4", "--out", str(tmp_path), timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "THRESHOLD MISSED [keyb2]: failure ratio 1.000 > 0.0" in result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    (row,) = summary["results"]
    assert row["scenario"] == "keyb2" and row["requests"] == row["failures"] > 0
    assert (tmp_path / "keyb2_stats.csv").exists() and (tmp_path / "summary.md").exists()


def test_runner_rejects_an_unknown_strategy():
    result = run_runner("--strategies", "keyb3", timeout=60)
    assert result.returncode == 2 and "unknown strategies ['keyb3']" in result.stderr


# --- live ---------------------------------------------------------------------------------------


@pytest.mark.triton
def test_bounded_locust_run_against_the_embedded_service_has_zero_failures(prepared_models, embedded_triton, tmp_path):
    """30 s, three users (keyb2, firstp, maxp), 3 candidates of 1-2k tokens per request (CPU-sized).

    Its own gateway, with the admission bound fixed above what three users queue: sized from the drain rate,
    the bound is what a CPU drains in half a deadline, and on a 2-core AVX2 CPU in fp32 a 22-sequence maxp
    request behind two others was answered 429 (as admission should; tests/test_api_admission.py covers
    that). This run checks the harness and that nothing fails, not this machine's capacity."""
    with serve_gateway(prepared_models, embedded_triton.grpc_url, max_queued_sequences=10_000) as url:
        result = run_runner("--host", url, "--strategies", "keyb2,firstp,maxp", "--mixed", "--users", "1",
                            "--run-time", "30s", "--stop-timeout", "60", "--docs-per-query", "3", "--max-tokens", "2000",
                            "--max-failure-ratio", "0", "--min-requests", "1", "--out", str(tmp_path), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {r["scenario"] for r in summary["results"]} == {"keyb2", "firstp", "maxp"}
    for row in summary["results"]:
        assert row["failures"] == 0 and row["requests"] >= 1, row
        assert row["p95_ms"] >= row["p50_ms"] > 0
    print((tmp_path / "summary.md").read_text())
