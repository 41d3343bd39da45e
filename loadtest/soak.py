"""Soak with fault injection: `keyrank serve` at ~80% of its measured capacity for
10 minutes, its model process (the Python backend stub) killed once and its
tritonserver killed once, as an OOM kill and a crash would.

    .venv/bin/python loadtest/soak.py --duration 600 --out runs/soak

It starts its own `keyrank serve` on loopback (free ports; nothing else is
reached), measures capacity with a closed loop, then sends an open-loop
stream at ``--load`` x capacity and reports, into ``--out/soak.json`` and
``soak.md``:

- lost requests: anything but a 200, except 503/429 answered while an outage
  lasted (from the kill until /readyz is 200 again); client timeouts and
  connection errors are lost too;
- how fast /readyz turned 503 after each kill and how long the repair took;
- p99 drift: p99 latency of the last window against the first (both clear
  of the outages);
- RSS growth of the gateway and of the model path (tritonserver + stubs).

Bounded: ``--duration``, ``--max-requests`` and ``--max-in-flight`` cap the
run; exits 1 when a goal (0 lost, drift < 20%, RSS growth < 10%) is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from payloads import REPO_ROOT, LoadConfig, build_payloads, rerank_body
from process_tree import alive, children, start_serve, stubs_of, tritonserver_of


@dataclass
class Outcome:
    """One request of the soak."""

    sent: float  # seconds since the soak began
    latency: float  # seconds to the answer (or to the error)
    status: int  # HTTP status; 0 = no answer (timeout, connection error)


@dataclass
class Fault:
    """One injected fault and how the service took it."""

    kind: str  # "stub" (the model process) or "triton" (the server)
    at: float  # seconds since the soak began
    readyz_503_after: float | None = None  # seconds from the kill to /readyz answering 503
    recovered_after: float | None = None  # seconds from the kill to /readyz answering 200 again
    pid: int = 0  # the process killed


@dataclass
class Report:
    """The soak's figures (soak.json)."""

    duration_s: float
    capacity_rps: float
    rate_rps: float
    requests: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    expected_outage_errors: int = 0  # 503/429 while an outage lasted
    lost: int = 0  # everything else that was not a 200
    skipped_in_flight_cap: int = 0  # sends skipped because --max-in-flight requests were open
    faults: list[Fault] = field(default_factory=list)
    p50_first_ms: float = 0.0
    p99_first_ms: float = 0.0
    p50_last_ms: float = 0.0
    p99_last_ms: float = 0.0
    p99_drift: float = 0.0  # (last - first) / first
    rss_mb: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # name -> [(t, MB)]
    rss_growth: dict[str, float] = field(default_factory=dict)


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def _post(client: httpx.AsyncClient, body: dict, t0: float, outcomes: list[Outcome]) -> None:
    sent = time.monotonic()
    try:
        status = (await client.post("/rerank", json=body)).status_code
    except httpx.HTTPError:
        status = 0
    outcomes.append(Outcome(sent - t0, time.monotonic() - sent, status))


async def measure_capacity(url: str, bodies: list[dict], seconds: float, concurrency: int, timeout: float) -> float:
    """Completed requests per second of a closed loop of ``concurrency`` clients (after one warm-up each)."""
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        await asyncio.gather(*(client.post("/rerank", json=bodies[i % len(bodies)]) for i in range(concurrency)))
        done = 0
        t0 = time.monotonic()

        async def loop(worker: int) -> None:
            nonlocal done
            i = worker
            while time.monotonic() - t0 < seconds:
                if (await client.post("/rerank", json=bodies[i % len(bodies)])).status_code == 200:
                    done += 1
                i += concurrency

        await asyncio.gather(*(loop(w) for w in range(concurrency)))
        return done / (time.monotonic() - t0)


async def inject(kind: str, serve_pid: int, url: str, t0: float, fault: Fault, limit_s: float = 60.0) -> None:
    """Kill the stub or the server, then time /readyz turning 503 and 200 again."""
    triton = tritonserver_of(serve_pid)
    fault.pid = stubs_of(triton)[0] if kind == "stub" else triton
    async with httpx.AsyncClient(base_url=url, timeout=1.0) as client:
        os.kill(fault.pid, signal.SIGKILL)
        killed = time.monotonic()
        fault.at = killed - t0
        while time.monotonic() - killed < limit_s:
            try:
                status = (await client.get("/readyz")).status_code
            except httpx.HTTPError:
                status = 0
            elapsed = time.monotonic() - killed
            if status != 200 and fault.readyz_503_after is None:
                fault.readyz_503_after = elapsed
            if status == 200 and fault.readyz_503_after is not None:
                fault.recovered_after = elapsed
                return
            await asyncio.sleep(0.02)


async def soak(args: argparse.Namespace, serve_pid: int, url: str, bodies: list[dict], report: Report) -> list[Outcome]:
    outcomes: list[Outcome] = []
    interval = 1.0 / report.rate_rps
    due = sorted([(at * args.duration, "stub") for at in args.stub_kill_at]
                 + [(at * args.duration, "triton") for at in args.triton_kill_at])
    limits = httpx.Limits(max_connections=args.max_in_flight, max_keepalive_connections=args.max_in_flight)
    t0 = time.monotonic()
    tasks: set[asyncio.Task] = set()
    fault_tasks = []
    next_rss = 0.0
    async with httpx.AsyncClient(base_url=url, timeout=args.timeout, limits=limits) as client:
        n = 0
        while (now := time.monotonic() - t0) < args.duration and n < args.max_requests:
            # One fault at a time: the next waits until the service is back from the last.
            if due and now >= due[0][0] and all(task.done() for task in fault_tasks):
                fault = Fault(due.pop(0)[1], now)
                report.faults.append(fault)
                fault_tasks.append(asyncio.create_task(inject(fault.kind, serve_pid, url, t0, fault)))
            if now >= next_rss:
                next_rss = now + 10.0
                sample(report, serve_pid, now)
            if len(tasks) >= args.max_in_flight:
                report.skipped_in_flight_cap += 1
            else:
                task = asyncio.create_task(_post(client, bodies[n % len(bodies)], t0, outcomes))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            n += 1
            # Open loop: the next send is due at n * interval whatever the answers do.
            await asyncio.sleep(max(0.0, n * interval - (time.monotonic() - t0)))
        await asyncio.gather(*tasks, *fault_tasks)
    sample(report, serve_pid, time.monotonic() - t0)
    return outcomes


def sample(report: Report, serve_pid: int, now: float) -> None:
    try:
        triton = tritonserver_of(serve_pid)
        model_path = [triton, *[p for p in children(triton) if alive(p)]]
    except AssertionError:  # between a kill and the restart
        model_path = []
    report.rss_mb.setdefault("gateway", []).append((round(now, 1), round(rss_mb([serve_pid]), 1)))
    if model_path:
        report.rss_mb.setdefault("model_path", []).append((round(now, 1), round(rss_mb(model_path), 1)))


def summarise(report: Report, outcomes: list[Outcome], args: argparse.Namespace) -> None:
    report.requests = len(outcomes)
    windows = [(f.at, f.at + (f.recovered_after or args.duration)) for f in report.faults]

    def during_outage(o: Outcome) -> bool:  # the request was open at some moment of an outage
        return any(o.sent <= end and o.sent + o.latency >= start for start, end in windows)

    for o in outcomes:
        report.by_status[str(o.status)] = report.by_status.get(str(o.status), 0) + 1
        if o.status == 200:
            continue
        if o.status in (503, 429) and during_outage(o):
            report.expected_outage_errors += 1
        else:
            report.lost += 1
    clean = [o for o in outcomes if o.status == 200 and not during_outage(o)]
    first = [o.latency * 1000 for o in clean if args.warmup <= o.sent < args.warmup + args.window]
    last = [o.latency * 1000 for o in clean if o.sent >= args.duration - args.window]
    report.p50_first_ms, report.p99_first_ms = statistics.median(first or [math.nan]), percentile(first, 0.99)
    report.p50_last_ms, report.p99_last_ms = statistics.median(last or [math.nan]), percentile(last, 0.99)
    report.p99_drift = (report.p99_last_ms - report.p99_first_ms) / report.p99_first_ms
    gateway = [mb for t, mb in report.rss_mb.get("gateway", []) if t >= args.warmup]
    if len(gateway) >= 2:
        report.rss_growth["gateway"] = (gateway[-1] - gateway[0]) / gateway[0]
    # Each fault replaces the model processes: compare them within one life, up to the first kill.
    first_fault = min((f.at for f in report.faults), default=args.duration)
    model = [mb for t, mb in report.rss_mb.get("model_path", []) if args.warmup <= t < first_fault]
    if len(model) >= 2:
        report.rss_growth["model_path_before_first_fault"] = (model[-1] - model[0]) / model[0]


def markdown(report: Report, command: str) -> str:
    lines = [
        f"command: `{command}`",
        "",
        (f"- capacity (closed loop): {_capacity(report.capacity_rps)}; soak rate {report.rate_rps:.2f} req/s "
        f"for {report.duration_s:.0f} s: {report.requests} requests, statuses {report.by_status}"),
        (f"- lost: {report.lost}; 503/429 during outages: {report.expected_outage_errors}; "
        f"sends skipped at the in-flight cap: {report.skipped_in_flight_cap}"),
    ]
    for f in report.faults:
        lines.append(
            f"- {f.kind} killed at {f.at:.0f} s: /readyz 503 after {_s(f.readyz_503_after)}, "
            f"200 again after {_s(f.recovered_after)}"
        )
    lines.append(
        f"- latency first window p50 {report.p50_first_ms:.0f} ms / p99 {report.p99_first_ms:.0f} ms; "
        f"last window p50 {report.p50_last_ms:.0f} ms / p99 {report.p99_last_ms:.0f} ms; p99 drift {report.p99_drift:+.1%}"
    )
    lines.append("- RSS growth: " + ", ".join(f"{k} {v:+.1%}" for k, v in report.rss_growth.items()))
    for name, series in report.rss_mb.items():
        lines.append(f"  - {name} RSS MB: " + " ".join(f"{mb:.0f}" for _, mb in series))
    return "\n".join(lines) + "\n"


def _capacity(rps: float) -> str:
    return "not measured (--rate given)" if math.isnan(rps) else f"{rps:.2f} req/s"


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=REPO_ROOT / "models", help="output of `keyrank prepare`")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of the soak (capacity measurement not included)")
    parser.add_argument("--load", type=float, default=0.8, help="fraction of the measured capacity to send")
    parser.add_argument("--rate", type=float, help="requests/s to send instead of --load x capacity")
    parser.add_argument("--capacity-seconds", type=float, default=60.0, help="length of the closed-loop capacity run")
    parser.add_argument("--concurrency", type=int, default=2, help="clients of the capacity run (the gateway's cores)")
    parser.add_argument("--docs", type=int, default=3, help="documents per request (QMSum passages)")
    parser.add_argument("--tokens", type=int, default=1500, help="approximate tokens per document")
    parser.add_argument("--strategy", default="keyb2", help="payload scenario (loadtest/payloads.py SCENARIOS)")
    parser.add_argument("--stub-kill-at", type=float, nargs="*", default=[1 / 3],
                        help="when to kill the model process, as fractions of --duration")
    parser.add_argument("--triton-kill-at", type=float, nargs="*", default=[2 / 3],
                        help="when to kill tritonserver, as fractions of --duration")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before the first latency window and RSS baseline")
    parser.add_argument("--window", type=float, default=120.0, help="seconds of the first and last latency windows")
    parser.add_argument("--timeout", type=float, default=40.0, help="client timeout per request (past the gateway's 30 s deadline)")
    parser.add_argument("--max-requests", type=int, default=20_000, help="hard cap on requests sent")
    parser.add_argument("--max-in-flight", type=int, default=32, help="hard cap on open requests")
    parser.add_argument("--max-p99-drift", type=float, default=0.2)
    parser.add_argument("--max-rss-growth", type=float, default=0.1)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "soak")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    config = LoadConfig.from_env({"LOADTEST_DOCS_PER_QUERY": str(args.docs), "LOADTEST_MIN_TOKENS": str(args.tokens // 2),
                                  "LOADTEST_MAX_TOKENS": str(args.tokens), "LOADTEST_PAYLOADS": "16",
                                  "LOADTEST_SEED": str(args.seed), "LOADTEST_TOP_N": "3"})
    bodies = [rerank_body(p, args.strategy, config.top_n) for p in build_payloads(config)]
    random.Random(args.seed).shuffle(bodies)

    proc, url = start_serve(args.model_dir.resolve(), args.out / "serve.log")
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            print(f"keyrank serve never became ready; see {args.out / 'serve.log'}", file=sys.stderr)
            return 2
        capacity = float("nan")
        if args.capacity_seconds > 0:
            print(f"soak: serve ready at {url}; measuring capacity for {args.capacity_seconds:.0f} s", flush=True)
            capacity = asyncio.run(measure_capacity(url, bodies, args.capacity_seconds, args.concurrency, args.timeout))
        elif args.rate is None:
            parser.error("--capacity-seconds 0 needs --rate")
        rate = args.rate or args.load * capacity
        report = Report(args.duration, capacity, rate)
        print(f"soak: capacity {capacity:.2f} req/s; sending {rate:.2f} req/s for {args.duration:.0f} s", flush=True)
        outcomes = asyncio.run(soak(args, proc.pid, url, bodies, report))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except Exception:  # noqa: BLE001 -- a stuck gateway must not keep the soak open
            proc.kill()
    summarise(report, outcomes, args)
    command = "python loadtest/soak.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "soak.json").write_text(json.dumps({**asdict(report), "command": command}, indent=2))
    (args.out / "soak.md").write_text(markdown(report, command))
    (args.out / "requests.json").write_text(json.dumps([asdict(o) for o in outcomes]))
    print(markdown(report, command), flush=True)
    ok = (
        report.lost == 0
        and report.p99_drift < args.max_p99_drift
        and all(v < args.max_rss_growth for v in report.rss_growth.values())
        and all(f.recovered_after is not None for f in report.faults)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
