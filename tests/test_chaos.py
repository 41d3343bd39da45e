"""Chaos under sustained load (loadtest/chaos.py): `keyrank serve` at a steady rate while its model
process is killed, stopped and resumed, and its tritonserver killed, at random moments. Every
request is answered, with a 200 or a 503 carrying Retry-After, nothing else.

Slow: 3 minutes of load by default, ``KEYRANK_CHAOS_MINUTES=10`` for the full run of
docs/RELIABILITY.md. No fast live variant: each fault alone is in tests/test_faults.py and
tests/test_supervision.py, and minutes of load on a busy 2-core CI box do not fit its budget. The
script's bookkeeping (what counts as anything else, the unavailability, the schedule) is checked
offline here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MINUTES = float(os.environ.get("KEYRANK_CHAOS_MINUTES", "3"))


def _chaos():
    spec = importlib.util.spec_from_file_location("loadtest_chaos", ROOT / "loadtest" / "chaos.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


chaos = _chaos()


def test_only_a_200_ranking_and_a_503_with_retry_after_pass_and_an_unanswered_request_fails_the_run():
    Outcome = chaos.Outcome
    outcomes = [
        Outcome(0.0, 0.1, 200, False),
        Outcome(1.0, 0.1, 503, True),
        Outcome(2.0, 0.1, 503, False),  # no Retry-After: a client cannot know when to come back
        Outcome(3.0, 60.0, 0, False, "ReadTimeout: "),
        Outcome(4.0, 0.1, 200, False, "no results list"),  # a 200 that ranks nothing
        Outcome(5.0, 0.1, 429, True),
        Outcome(6.0, 0.1, 200, False),
    ]
    report = chaos.Report("test", 0, 1.0, 1.0, sent=len(outcomes), ready_at_end_s=0.1, serve_exit=0)
    report.faults = [chaos.Fault("stub-kill", 0.5, at=0.5)]
    chaos.summarise(report, outcomes)
    assert (report.ok, report.unavailable, report.other, report.answered) == (2, 1, 4, 6)
    assert report.other_detail == {"503 without Retry-After": 1, "ReadTimeout": 1, "200 no results list": 1, "429": 1}
    # From the send of the first non-200 (1 s) to the send of the next 200 (6 s), after the fault at 0.5 s.
    assert [(w.start, w.end, w.requests, w.after_fault) for w in report.windows] == [(1.0, 6.0, 5, 0)]
    assert report.longest_unavailability_s == 5.0
    failures = chaos.verdict(report)
    assert len(failures) == 2 and "4 answers" in failures[0] and "1 of 7 requests got no answer" in failures[1]


def test_the_fault_schedule_is_bounded_spaced_seeded_and_covers_every_kind():
    first = chaos.schedule(random.Random(0), 12, 15.0, 570.0, 20.0)
    assert first == chaos.schedule(random.Random(0), 12, 15.0, 570.0, 20.0)
    assert len(first) == 12 and all(15.0 <= f.due <= 570.0 for f in first)
    assert all(b.due - a.due >= 20.0 - 0.01 for a, b in zip(first, first[1:]))
    assert {f.kind for f in first[:3]} == set(chaos.KINDS)
    with pytest.raises(ValueError, match="cannot be 20 s apart"):
        chaos.schedule(random.Random(0), 30, 15.0, 570.0, 20.0)


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.timeout(int(MINUTES * 60) + 600)
def test_under_load_every_fault_is_answered_with_200_or_503_retry_after_and_nothing_else(prepared_models: Path, tmp_path: Path):
    out = tmp_path / "chaos"
    # `keyrank serve` is started by the script: it must import this checkout's keyrank.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "service"), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, str(ROOT / "loadtest" / "chaos.py"), "--minutes", str(MINUTES), "--model-dir", str(prepared_models),
         "--out", str(out), "--seed", os.environ.get("KEYRANK_CHAOS_SEED", "0")],
        env=env, capture_output=True, text=True, timeout=MINUTES * 60 + 540, check=False,
    )
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:] + (out / "serve.log").read_text()[-3000:]
    report = json.loads((out / "chaos.json").read_text())
    assert report["other"] == 0, report["other_detail"]
    assert report["sent"] == report["answered"] == report["ok"] + report["unavailable"] > 0
    # Outages are seconds each: the service served most of the run, even on a busy machine.
    assert report["ok"] > report["sent"] / 2
    assert all(fault["at"] is not None for fault in report["faults"]), report["faults"]
    assert set(report["faults_by_kind"]) == {"stub-kill", "stub-stop", "triton-kill"}
    assert report["ready_at_end_s"] is not None and report["serve_exit"] == 0
    # A leak of the gateway (a client or channel kept per fault) would show across the restarts.
    gateway = report["rss_mb"]["gateway"]
    assert gateway[-1][1] < 1.25 * gateway[0][1], gateway
    assert len(json.loads((out / "requests.json").read_text())) == report["sent"]
