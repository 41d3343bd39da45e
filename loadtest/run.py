"""Headless load test: run locust per strategy, summarise, check thresholds.

    python loadtest/run.py --host http://localhost:8080 \
        --strategies keyb2,maxp,firstp --users 8 --run-time 60s \
        --max-failure-ratio 0 --max-p95-ms 2000 --min-rps 5

Each scenario runs alone (its own locust process, so one strategy's latency
is not another's queueing), unless --mixed runs them together as one user
population. Writes into --out: locust's CSVs (<scenario>_stats.csv, ...),
summary.json and summary.md (requests/s, p50/p95/p99, failures per
scenario; from the locustfile's final statistics, which locust's CSVs can
trail by a second), and exits 1 when a threshold is missed, 2 when locust produced no
statistics. Payload options (--docs-per-query, ...) are passed to the
locustfile as LOADTEST_* variables (see payloads.LoadConfig).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from payloads import REPO_ROOT, SCENARIOS, user_class_name

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"


@dataclass(frozen=True)
class ScenarioResult:
    """One row of the summary: a scenario's locust statistics."""

    scenario: str  # key of payloads.SCENARIOS
    requests: int  # completed requests (successes and failures)
    failures: int  # failed requests
    failure_ratio: float  # failures / requests (1.0 when nothing completed)
    rps: float  # requests per second over the run
    p50_ms: float  # median latency
    p95_ms: float  # 95th percentile latency
    p99_ms: float  # 99th percentile latency
    avg_ms: float  # mean latency


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default=os.environ.get("LOADTEST_HOST", "http://127.0.0.1:8080"), help="gateway base URL")
    parser.add_argument("--strategies", default="keyb2,maxp,firstp", help=f"comma list or 'all'; of {', '.join(SCENARIOS)}")
    parser.add_argument("--users", type=int, default=4, help="concurrent users (per scenario)")
    parser.add_argument("--spawn-rate", type=float, default=None, help="users started per second (default: all at once)")
    parser.add_argument("--run-time", default="60s", help="locust duration per scenario, e.g. 30s, 5m")
    parser.add_argument("--stop-timeout", type=int, default=30, help="seconds in-flight requests get to finish at the end")
    parser.add_argument("--mixed", action="store_true", help="run all scenarios in one locust process")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default runs/loadtest/<time>)")
    parser.add_argument("--docs-per-query", type=int, help="LOADTEST_DOCS_PER_QUERY (default 64)")
    parser.add_argument("--min-tokens", type=int, help="LOADTEST_MIN_TOKENS (default 1000)")
    parser.add_argument("--max-tokens", type=int, help="LOADTEST_MAX_TOKENS (default 3000)")
    parser.add_argument("--datasets", type=Path, help="LOADTEST_DATASETS (default ../shared/datasets)")
    # Thresholds: checked per scenario; unset ones are not checked.
    parser.add_argument("--max-failure-ratio", type=float, default=0.0, help="highest allowed failures/requests")
    parser.add_argument("--min-requests", type=int, default=1, help="fewest completed requests per scenario")
    parser.add_argument("--min-rps", type=float, help="lowest allowed requests/s")
    parser.add_argument("--max-p50-ms", type=float, help="highest allowed median latency")
    parser.add_argument("--max-p95-ms", type=float, help="highest allowed p95 latency")
    parser.add_argument("--max-p99-ms", type=float, help="highest allowed p99 latency")
    args = parser.parse_args(argv)
    args.scenarios = list(SCENARIOS) if args.strategies == "all" else [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown strategies {unknown}; choose from {', '.join(SCENARIOS)}")
    if args.out is None:
        args.out = REPO_ROOT / "runs" / "loadtest" / time.strftime("%Y%m%d-%H%M%S")
    return args


def payload_env(args: argparse.Namespace) -> dict[str, str]:
    """The locustfile's environment: ours plus the payload options given."""
    env = dict(os.environ)
    for flag, var in [("docs_per_query", "LOADTEST_DOCS_PER_QUERY"), ("min_tokens", "LOADTEST_MIN_TOKENS"),
                      ("max_tokens", "LOADTEST_MAX_TOKENS"), ("datasets", "LOADTEST_DATASETS")]:
        if getattr(args, flag) is not None:
            env[var] = str(getattr(args, flag))
    return env


def run_locust(args: argparse.Namespace, scenarios: list[str], prefix: Path) -> int:
    """One headless locust process over `scenarios`; CSVs land at `prefix`_*.csv,
    the final statistics at `prefix`_final.json."""
    users = args.users * len(scenarios) if args.mixed else args.users
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", args.host,
        "--users", str(users), "--spawn-rate", str(args.spawn_rate or users), "--run-time", args.run_time,
        "--stop-timeout", str(args.stop_timeout), "--csv", str(prefix), "--only-summary",
        "--html", f"{prefix}.html", *[user_class_name(s) for s in scenarios],
    ]
    print("+", " ".join(command), flush=True)
    env = payload_env(args) | {"LOADTEST_STATS_JSON": f"{prefix}_final.json"}
    return subprocess.run(command, env=env, check=False).returncode


def read_stats(final_json: Path, scenarios: list[str]) -> list[ScenarioResult]:
    """Per-scenario rows of the locustfile's final statistics (request names "/rerank [<scenario>]")."""
    rows = {row["name"]: row for row in json.loads(final_json.read_text())}
    results = []
    for scenario in scenarios:
        row = rows.get(f"/rerank [{scenario}]")
        if row is None or not row["requests"]:  # no request of this scenario completed at all
            results.append(ScenarioResult(scenario, 0, 0, 1.0, 0.0, *[float("nan")] * 4))
            continue
        results.append(ScenarioResult(
            scenario=scenario,
            requests=row["requests"],
            failures=row["failures"],
            failure_ratio=row["failures"] / row["requests"],
            rps=row["rps"],
            p50_ms=row["p50_ms"],
            p95_ms=row["p95_ms"],
            p99_ms=row["p99_ms"],
            avg_ms=row["avg_ms"],
        ))
    return results


def missed_thresholds(result: ScenarioResult, args: argparse.Namespace) -> list[str]:
    """The thresholds a scenario missed, in words."""
    checks = [
        (result.requests < args.min_requests, f"{result.requests} requests < {args.min_requests}"),
        (result.failure_ratio > args.max_failure_ratio, f"failure ratio {result.failure_ratio:.3f} > {args.max_failure_ratio}"),
        (args.min_rps is not None and result.rps < args.min_rps, f"{result.rps:.2f} req/s < {args.min_rps}"),
        (args.max_p50_ms is not None and not result.p50_ms <= args.max_p50_ms, f"p50 {result.p50_ms} ms > {args.max_p50_ms}"),
        (args.max_p95_ms is not None and not result.p95_ms <= args.max_p95_ms, f"p95 {result.p95_ms} ms > {args.max_p95_ms}"),
        (args.max_p99_ms is not None and not result.p99_ms <= args.max_p99_ms, f"p99 {result.p99_ms} ms > {args.max_p99_ms}"),
    ]
    return [message for missed, message in checks if missed]


def markdown_table(results: list[ScenarioResult], args: argparse.Namespace) -> str:
    lines = [
        f"host {args.host}, {args.users} users per scenario, {args.run_time} each" + (" (mixed)" if args.mixed else ""),
        "",
        "| strategy | requests | failures | req/s | p50 ms | p95 ms | p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(f"| {r.scenario} | {r.requests} | {r.failures} | {r.rps:.2f} | {r.p50_ms:.0f} | {r.p95_ms:.0f} | {r.p99_ms:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [("mixed", args.scenarios)] if args.mixed else [(s, [s]) for s in args.scenarios]
    results: list[ScenarioResult] = []
    for name, scenarios in batches:
        prefix = args.out / name
        run_locust(args, scenarios, prefix)
        stats = Path(f"{prefix}_final.json")
        if not stats.exists():
            print(f"locust wrote no statistics for {name} ({stats})", file=sys.stderr)
            return 2
        results.extend(read_stats(stats, scenarios))

    missed = {r.scenario: missed_thresholds(r, args) for r in results}
    summary = {
        "host": args.host, "users": args.users, "run_time": args.run_time, "mixed": args.mixed,
        # NaN (no request completed) is written as null: strict JSON has no NaN.
        "results": [{k: (None if v != v else v) for k, v in asdict(r).items()} for r in results],
        "missed": {k: v for k, v in missed.items() if v},
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = markdown_table(results, args)
    (args.out / "summary.md").write_text(table)
    print(table)
    for scenario, messages in missed.items():
        for message in messages:
            print(f"THRESHOLD MISSED [{scenario}]: {message}", file=sys.stderr)
    print(f"written to {args.out}")
    return 1 if summary["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
