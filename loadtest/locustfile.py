"""Locust scenarios for keyrank: one user class per strategy (and selector).

Each user replays QMSum payloads (payloads.py: a human query, 64 candidates of
1-3k tokens by default) against POST /rerank with its scenario's strategy, back
to back. A response counts as a failure unless it is 200 and ranks exactly
min(top_n, candidates) distinct candidates by non-increasing score.

    locust -f loadtest/locustfile.py --host http://localhost:8080 Keyb2User
    python loadtest/run.py --host http://localhost:8080 --strategies keyb2,maxp

Payload shape and auth come from the environment (payloads.LoadConfig):
LOADTEST_DATASETS, LOADTEST_DOCS_PER_QUERY, LOADTEST_MIN_TOKENS,
LOADTEST_MAX_TOKENS, LOADTEST_PAYLOADS, LOADTEST_TOP_N, LOADTEST_SEED,
LOADTEST_API_KEY (sent as a Bearer token), LOADTEST_WAIT_S (pause between a
user's requests; 0 = closed loop at full speed), LOADTEST_STATS_JSON (file for
the final per-request-name statistics, read by run.py).
"""

from __future__ import annotations

import json
import os
import random
from functools import lru_cache

from locust import HttpUser, constant, events, task
from payloads import (
    SCENARIOS,
    LoadConfig,
    RerankPayload,
    build_payloads,
    ranking_problem,
    rerank_body,
    user_class_name,
)


@lru_cache(maxsize=1)
def _payloads() -> tuple[LoadConfig, list[RerankPayload]]:
    """Built once per locust process and shared by its users."""
    config = LoadConfig.from_env()
    return config, build_payloads(config)


class RerankUser(HttpUser):
    """Posts one scenario's /rerank requests; subclasses name the scenario."""

    abstract = True
    scenario = "keyb2"  # key of payloads.SCENARIOS
    wait_time = constant(float(os.environ.get("LOADTEST_WAIT_S", "0")))

    def on_start(self) -> None:
        self.config, self.payloads = _payloads()
        self.rng = random.Random()
        self.headers = {"content-type": "application/json"}
        if key := os.environ.get("LOADTEST_API_KEY"):
            self.headers["authorization"] = f"Bearer {key}"

    @task
    def rerank(self) -> None:
        payload = self.rng.choice(self.payloads)
        body = rerank_body(payload, self.scenario, self.config.top_n)
        with self.client.post(
            "/rerank", json=body, headers=self.headers, name=f"/rerank [{self.scenario}]", catch_response=True
        ) as response:
            if response.status_code == 0:  # no HTTP answer: connection refused, reset, timeout
                response.failure(f"no response: {response.error}")
                return
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            problem = ranking_problem(response.json(), len(payload.documents), self.config.top_n)
            if problem:
                response.failure(problem)


@events.quitting.add_listener
def _write_final_stats(environment, **_kwargs) -> None:
    """Final statistics for run.py: locust's --csv files are rewritten only once
    a second, so their last rows can miss the run's final second."""
    path = os.environ.get("LOADTEST_STATS_JSON")
    if not path or environment.runner is None:
        return
    rows = []
    for entry in [*environment.runner.stats.entries.values(), environment.runner.stats.total]:
        rows.append({
            "name": entry.name,
            "requests": entry.num_requests,
            "failures": entry.num_failures,
            "rps": entry.total_rps,
            "p50_ms": entry.get_response_time_percentile(0.50),
            "p95_ms": entry.get_response_time_percentile(0.95),
            "p99_ms": entry.get_response_time_percentile(0.99),
            "avg_ms": entry.avg_response_time,
        })
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(rows, handle, indent=2)


# One concrete user class per scenario (FirstpUser, MaxpUser, ..., Keyb2CrossUser),
# so a run picks scenarios by class name and locust reports each on its own row.
for _scenario in SCENARIOS:
    globals()[user_class_name(_scenario)] = type(
        user_class_name(_scenario), (RerankUser,), {"scenario": _scenario, "__doc__": f"/rerank with {_scenario}."}
    )
del _scenario
