"""Chaos under sustained load (loadtest/chaos.py): `keyrank serve` at a steady rate while its model
process is killed, stopped and resumed, and its tritonserver killed, at random moments. Every
request is answered, with a 200 or a 503 carrying Retry-After, nothing else.

Slow: 3 minutes of load by default, ``KEYRANK_CHAOS_MINUTES=10`` for the full run of
docs/RELIABILITY.md. No fast variant: each fault alone is in tests/test_faults.py and
tests/test_supervision.py, and minutes of load on a busy 2-core CI box do not fit its budget.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MINUTES = float(os.environ.get("KEYRANK_CHAOS_MINUTES", "3"))


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
