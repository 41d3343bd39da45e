"""Chaos under sustained load: `keyrank serve` at a steady request rate while its model process is
killed, stopped and resumed, and its tritonserver killed, at random moments.

    python loadtest/chaos.py --minutes 10 --model-dir models --out runs/chaos

It starts its own `keyrank serve` (embedded Triton; gateway and Triton on free loopback ports,
nothing else is reached), sends an open-loop stream of /rerank requests at ``--rate`` for
``--minutes`` and, from ``--seed``, injects ``--faults`` faults (a bounded count), one in each
equal slot of the run at a random moment, spaced at least ``--min-gap`` seconds, cycling through
the three kinds in a shuffled order:

- ``stub-kill``: SIGKILL a Python-backend stub of the tritonserver (the model process; an OOM kill);
- ``stub-stop``: SIGSTOP it, SIGCONT it ``--stop-seconds`` later (a frozen process; the supervisor
  may have replaced it by then);
- ``triton-kill``: SIGKILL the tritonserver itself (a crash).

Every request ends in one of: 200 with a valid ranking; 503 with ``Retry-After`` (the documented
"retry" answer during an outage); anything else (no answer: timeout, refused or reset connection;
a 503 without ``Retry-After``; any other status; a 200 that is not a valid ranking). "Anything
else" must be 0 and every request sent must be answered. It reports those counts, the longest
unavailability (longest run of consecutive answers other than a valid 200, in send order, from
the first one's send to the send of the next request answered a valid 200), the RSS of the gateway and of the model path
(tritonserver and its children) at the start and the end of the load, and the faults by kind,
into ``--out/chaos.json`` (per-request outcomes in ``requests.json``), and prints a summary.
Exits 1 when anything else > 0, a request went unanswered, the service was not ready again at the
end or `keyrank serve` did not stop cleanly; 2 when it never became ready.

Open loop (the n-th request is sent at n / rate whatever the answers do), not locust's
constant-throughput users: a user waiting on a slow answer sends nothing meanwhile, which would
hide an outage's requests. Bounded: ``--minutes``, ``--max-requests``, ``--max-in-flight``, the
client timeout, ``--faults``; every wait has a limit.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from payloads import REPO_ROOT, LoadConfig, build_payloads, ranking_problem, rerank_body
from process_tree import alive, children, command_line, start_serve, stubs_of
from soak import rss_mb

KINDS = ("stub-kill", "stub-stop", "triton-kill")


@dataclass
class Outcome:
    """One request."""

    sent: float  # seconds since the load began
    latency: float  # seconds to the answer (or to the error)
    status: int  # HTTP status; 0 = no answer (timeout, connection error)
    retry_after: bool  # the answer carried Retry-After
    detail: str = ""  # for anything but a valid 200: the error, or the start of the body


@dataclass
class Fault:
    """One injected fault."""

    kind: str  # one of KINDS
    due: float  # seconds since the load began, as scheduled
    at: float | None = None  # when the signal was sent (None: no target appeared in time)
    pid: int = 0  # the process signalled
    waited_s: float = 0.0  # how long the target took to appear (a repair of the previous fault still running)
    stopped_s: float | None = None  # stub-stop: seconds between SIGSTOP and SIGCONT
    resumed: bool | None = None  # stub-stop: the stopped process was still there to resume


@dataclass
class Window:
    """A run of consecutive answers other than a valid 200 (in send order)."""

    start: float  # send time of its first request
    end: float  # send time of the next request answered a valid 200 (or of its last request, at the end)
    requests: int  # answers in it
    after_fault: int | None  # index in faults of the last fault injected before it started


@dataclass
class Report:
    """The run's figures (chaos.json)."""

    command: str
    seed: int
    minutes: float
    rate_rps: float
    sent: int = 0
    answered: int = 0  # requests that got an HTTP answer (any status)
    ok: int = 0  # 200 with a valid ranking
    unavailable: int = 0  # 503 with Retry-After
    other: int = 0  # anything else: must be 0
    other_detail: dict[str, int] = field(default_factory=dict)
    by_status: dict[str, int] = field(default_factory=dict)
    skipped_in_flight_cap: int = 0  # sends skipped because --max-in-flight requests were open
    longest_unavailability_s: float = 0.0
    windows: list[Window] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    faults_by_kind: dict[str, int] = field(default_factory=dict)
    repairs: int = 0  # "; repairing" lines in serve.log
    rss_mb: dict[str, list[tuple]] = field(default_factory=dict)  # gateway -> [(t, MB)]; model_path -> [(t, MB, processes)]
    p50_ms: float = 0.0  # latency of the 200s
    p99_ms: float = 0.0
    serve_died: str = ""  # `keyrank serve` exited during the run: its exit status
    ready_at_end_s: float | None = None  # seconds after the load for /readyz to answer 200
    serve_exit: int | None = None  # exit status of `keyrank serve` after SIGTERM
    failures: list[str] = field(default_factory=list)


# --- the process tree --------------------------------------------------------------------------


def _start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (tells a process from a later one reusing its pid)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _tritonserver(serve_pid: int) -> int | None:
    """The live tritonserver child of ``serve_pid`` (None between a kill and the restart)."""
    tritons = [p for p in children(serve_pid) if "tritonserver" in command_line(p) and alive(p)]
    return tritons[0] if len(tritons) == 1 else None


def _model_path(serve_pid: int) -> list[int]:
    """tritonserver and its descendants (stubs and their watchers)."""
    triton = _tritonserver(serve_pid)
    if triton is None:
        return []
    tree, todo = [], [triton]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(p for p in children(pid) if alive(p))
    return tree


def _sample_rss(report: Report, serve_pid: int, now: float) -> None:
    report.rss_mb.setdefault("gateway", []).append((round(now, 1), round(rss_mb([serve_pid]), 1)))
    if model := _model_path(serve_pid):
        # The process count tells a model path that grew from one that kept a process too many.
        report.rss_mb.setdefault("model_path", []).append((round(now, 1), round(rss_mb(model), 1), len(model)))


# --- faults --------------------------------------------------------------------------------------


def schedule(rng: random.Random, count: int, first: float, last: float, min_gap: float,
             kinds_used: tuple[str, ...] = KINDS) -> list[Fault]:
    """``count`` faults in [first, last]: one at a random moment of each equal slot, consecutive ones
    at least ``min_gap`` apart, kinds in shuffled rounds of ``kinds_used`` (so each occurs once count
    reaches their number)."""
    if count <= 0 or last <= first:
        return []
    slot = (last - first) / count
    if slot < min_gap:
        raise ValueError(f"{count} faults in {last - first:.0f} s cannot be {min_gap:.0f} s apart; lower --faults or --min-gap")
    kinds: list[str] = []
    while len(kinds) < count:
        kinds.extend(rng.sample(kinds_used, len(kinds_used)))
    # An offset in [0, slot - min_gap] within each slot keeps neighbours >= min_gap apart.
    return [Fault(kinds[i], round(first + i * slot + rng.uniform(0, slot - min_gap), 2)) for i in range(count)]


async def _target(kind: str, serve_pid: int, rng: random.Random, limit_s: float) -> int | None:
    """A process to signal: a live stub of our tritonserver, or the tritonserver; waits (bounded)
    while the previous fault's repair has not brought one back."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        triton = _tritonserver(serve_pid)
        if triton is not None:
            if kind == "triton-kill":
                return triton
            if stubs := stubs_of(triton):
                return rng.choice(stubs)
        await asyncio.sleep(0.1)
    return None


async def inject(faults: list[Fault], serve_pid: int, t0: float, rng: random.Random, stop_seconds: tuple[float, float],
                 target_wait_s: float) -> None:
    """Send each fault's signal at its time; only ever to a child or grandchild of our `keyrank serve`."""
    for fault in faults:
        await asyncio.sleep(max(0.0, t0 + fault.due - time.monotonic()))
        looked = time.monotonic()
        pid = await _target(fault.kind, serve_pid, rng, target_wait_s)
        if pid is None:
            continue
        fault.pid, fault.waited_s = pid, round(time.monotonic() - looked, 2)
        born = _start_time(pid)
        try:
            os.kill(pid, signal.SIGSTOP if fault.kind == "stub-stop" else signal.SIGKILL)
        except ProcessLookupError:  # gone between the look-up and the signal: nothing was injected
            continue
        fault.at = round(time.monotonic() - t0, 2)
        if fault.kind == "stub-stop":
            # Log-uniform: about a third of the pauses end before the supervisor kills a stopped stub
            # (0.3 s), so waking a frozen stub that Triton still uses is exercised too.
            pause = math.exp(rng.uniform(math.log(stop_seconds[0]), math.log(stop_seconds[1])))
            await asyncio.sleep(pause)
            fault.stopped_s = round(pause, 2)
            # The supervisor kills a stub stopped for long; resume only the very process we stopped.
            fault.resumed = alive(pid) and _start_time(pid) == born
            if fault.resumed:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    fault.resumed = False
        print(f"chaos: {fault.kind} pid {pid} at {fault.at:.1f} s"
              + (f" (resumed after {fault.stopped_s:.1f} s)" if fault.resumed else ""), flush=True)


# --- load ------------------------------------------------------------------------------------------


async def _post(client: httpx.AsyncClient, body: dict, n_documents: int, top_n: int, t0: float,
                outcomes: list[Outcome]) -> None:
    sent = time.monotonic()
    try:
        response = await client.post("/rerank", json=body)
    except httpx.HTTPError as exc:
        outcomes.append(Outcome(sent - t0, time.monotonic() - sent, 0, False, f"{type(exc).__name__}: {exc}"[:200]))
        return
    outcome = Outcome(sent - t0, time.monotonic() - sent, response.status_code, "retry-after" in response.headers)
    if response.status_code == 200:
        try:
            problem = ranking_problem(response.json(), n_documents, top_n)
        except ValueError as exc:
            problem = f"not JSON: {exc}"
        outcome.detail = problem or ""
    else:
        outcome.detail = response.text[:200]
    outcomes.append(outcome)


async def load(args: argparse.Namespace, serve_pid: int, url: str, bodies: list[dict], report: Report,
               proc_alive) -> list[Outcome]:
    outcomes: list[Outcome] = []
    duration = args.minutes * 60
    rng = random.Random(args.seed)
    report.faults = schedule(rng, args.faults, args.first_fault, duration - args.quiet_end, args.min_gap, tuple(args.kinds))
    limits = httpx.Limits(max_connections=args.max_in_flight, max_keepalive_connections=args.max_in_flight)
    tasks: set[asyncio.Task] = set()
    interval = 1.0 / args.rate
    async with httpx.AsyncClient(base_url=url, timeout=args.timeout, limits=limits) as client:
        t0 = time.monotonic()
        chaos = asyncio.create_task(inject(report.faults, serve_pid, t0, rng, tuple(args.stop_seconds), args.target_wait))
        next_rss, n = 0.0, 0
        while (now := time.monotonic() - t0) < duration and n < args.max_requests:
            if now >= next_rss:
                next_rss = now + args.rss_every
                _sample_rss(report, serve_pid, now)
                if not report.serve_died and not proc_alive():
                    report.serve_died = "keyrank serve exited during the run"
            if len(tasks) >= args.max_in_flight:
                report.skipped_in_flight_cap += 1
            else:
                body = bodies[n % len(bodies)]
                task = asyncio.create_task(_post(client, body, len(body["documents"]), body["top_n"], t0, outcomes))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                report.sent += 1
            n += 1
            await asyncio.sleep(max(0.0, n * interval - (time.monotonic() - t0)))
        # The client timeout ends every request; the margin only guards against a hang in the client itself.
        done, pending = await asyncio.wait([*tasks, chaos], timeout=args.timeout + 30)
        for task in pending:
            task.cancel()
        _sample_rss(report, serve_pid, time.monotonic() - t0)
    return outcomes


# --- figures ---------------------------------------------------------------------------------------


def classify(o: Outcome) -> str:
    if o.status == 200 and not o.detail:
        return "ok"
    if o.status == 503 and o.retry_after:
        return "unavailable"
    return "other"


def summarise(report: Report, outcomes: list[Outcome]) -> None:
    outcomes.sort(key=lambda o: o.sent)
    report.answered = sum(o.status != 0 for o in outcomes)
    for o in outcomes:
        kind = classify(o)
        report.by_status[str(o.status)] = report.by_status.get(str(o.status), 0) + 1
        if kind == "ok":
            report.ok += 1
        elif kind == "unavailable":
            report.unavailable += 1
        else:
            report.other += 1
            what = (f"{o.status} without Retry-After" if o.status == 503 else
                    f"200 {o.detail}" if o.status == 200 else
                    o.detail.split(":")[0] if o.status == 0 else str(o.status))
            report.other_detail[what] = report.other_detail.get(what, 0) + 1
    injected = [(i, f) for i, f in enumerate(report.faults) if f.at is not None]
    run: list[Outcome] = []
    for o in [*outcomes, None]:
        if o is not None and classify(o) != "ok":  # a 200 that ranks nothing is no service either
            run.append(o)
            continue
        if run:
            end = o.sent if o is not None else run[-1].sent
            before = [i for i, f in injected if f.at <= run[0].sent + run[0].latency]
            report.windows.append(Window(round(run[0].sent, 2), round(end, 2), len(run), before[-1] if before else None))
            run = []
    report.longest_unavailability_s = max((w.end - w.start for w in report.windows), default=0.0)
    for _, f in injected:
        report.faults_by_kind[f.kind] = report.faults_by_kind.get(f.kind, 0) + 1
    latencies = sorted(o.latency * 1000 for o in outcomes if classify(o) == "ok")
    if latencies:
        report.p50_ms = round(latencies[len(latencies) // 2], 1)
        report.p99_ms = round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1)


def verdict(report: Report) -> list[str]:
    failures = []
    if report.other:
        failures.append(f"{report.other} answers neither 200 nor 503 with Retry-After: {report.other_detail}")
    if report.answered != report.sent:
        failures.append(f"{report.sent - report.answered} of {report.sent} requests got no answer")
    if report.serve_died:
        failures.append(report.serve_died)
    if report.ready_at_end_s is None:
        failures.append("/readyz was not 200 after the load")
    if report.serve_exit != 0:
        failures.append(f"keyrank serve exited {report.serve_exit} on SIGTERM")
    return failures


def _rss(report: Report, name: str) -> str:
    series = report.rss_mb.get(name) or [(0, float("nan"))]
    return f"{series[0][1]:.0f} MB -> {series[-1][1]:.0f} MB"


def markdown(report: Report) -> str:
    lines = [
        f"command: `{report.command}`",
        "",
        "| | figure |",
        "| --- | --- |",
        f"| load | {report.rate_rps:g} req/s for {report.minutes:g} min, open loop (sends skipped at the in-flight cap: {report.skipped_in_flight_cap}) |",
        f"| requests sent / answered | {report.sent} / {report.answered} |",
        f"| 200 | {report.ok} |",
        f"| 503 with Retry-After | {report.unavailable} |",
        f"| anything else | **{report.other}** {report.other_detail or ''} |",
        f"| longest unavailability | {report.longest_unavailability_s:.1f} s ({len(report.windows)} windows) |",
        f"| faults | {', '.join(f'{k} {v}' for k, v in sorted(report.faults_by_kind.items()))}; {report.repairs} repairs in serve.log |",
        f"| latency of the 200s | p50 {report.p50_ms:.0f} ms, p99 {report.p99_ms:.0f} ms |",
        f"| RSS gateway, start -> end | {_rss(report, 'gateway')} |",
        f"| RSS model path (tritonserver + stubs), start -> end | {_rss(report, 'model_path')} |",
        "",
    ]
    for i, f in enumerate(report.faults):
        extra = f", stopped {f.stopped_s:.1f} s, {'resumed' if f.resumed else 'already replaced'}" if f.kind == "stub-stop" else ""
        windows = [w for w in report.windows if w.after_fault == i]
        down = "; ".join(f"{w.requests} not served over {w.end - w.start:.1f} s" for w in windows) or "all served"
        at = "not injected (no target)" if f.at is None else f"at {f.at:.1f} s"
        lines.append(f"- fault {i}: {f.kind} {at}{extra}: {down}")
    if report.failures:
        lines += ["", *[f"FAILED: {failure}" for failure in report.failures]]
    return "\n".join(lines) + "\n"


# --- main ------------------------------------------------------------------------------------------


def _wait_ready(url: str, limit_s: float, proc=None) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and (proc is None or proc.poll() is None):
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return round(time.monotonic() - t0, 2)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the load")
    parser.add_argument("--rate", type=float, default=1.0, help="requests per second (open loop)")
    parser.add_argument("--faults", type=int, help="faults to inject (default: one per 45 s of the fault span, at least 3)")
    parser.add_argument("--first-fault", type=float, default=15.0, help="seconds of load before the first fault's slot")
    parser.add_argument("--quiet-end", type=float, default=30.0, help="seconds at the end with no fault (time to recover)")
    parser.add_argument("--min-gap", type=float, default=20.0,
                        help="least seconds between faults (the supervisor counts a fault back within 10 s of a repair as a failed repair)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="fault kinds to inject (to reproduce one)")
    parser.add_argument("--stop-seconds", type=float, nargs=2, default=[0.1, 3.0], metavar=("MIN", "MAX"),
                        help="how long a stopped stub stays stopped before SIGCONT (log-uniform in the range)")
    parser.add_argument("--target-wait", type=float, default=60.0, help="most seconds a fault waits for its target to be back")
    parser.add_argument("--model-dir", type=Path, default=REPO_ROOT / "models", help="output of `keyrank prepare`")
    parser.add_argument("--docs", type=int, default=3, help="documents per request (QMSum passages)")
    parser.add_argument("--tokens", type=int, default=400, help="approximate longest document, in tokens (shortest: half)")
    parser.add_argument("--strategy", default="keyb2", help="payload scenario (loadtest/payloads.py SCENARIOS)")
    parser.add_argument("--timeout", type=float, default=60.0, help="client timeout per request (well past the gateway's 30 s deadline)")
    parser.add_argument("--max-requests", type=int, default=20_000, help="hard cap on sends")
    parser.add_argument("--max-in-flight", type=int, default=32, help="hard cap on open requests")
    parser.add_argument("--rss-every", type=float, default=10.0, help="seconds between RSS samples")
    parser.add_argument("--seed", type=int, default=0, help="fault moments, kinds and targets; payloads")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "chaos")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.minutes <= 0 or not 0 < args.stop_seconds[0] <= args.stop_seconds[1]:
        parser.error("--rate, --minutes and --stop-seconds must be positive")
    if args.faults is None:
        args.faults = max(3, int((args.minutes * 60 - args.first_fault - args.quiet_end) // 45))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python loadtest/chaos.py " + " ".join(argv if argv is not None else sys.argv[1:])
    config = LoadConfig.from_env({"LOADTEST_DOCS_PER_QUERY": str(args.docs), "LOADTEST_MIN_TOKENS": str(args.tokens // 2),
                                  "LOADTEST_MAX_TOKENS": str(args.tokens), "LOADTEST_PAYLOADS": "16",
                                  "LOADTEST_SEED": str(args.seed), "LOADTEST_TOP_N": "3",
                                  **{k: v for k, v in os.environ.items() if k == "LOADTEST_DATASETS"}})
    bodies = [rerank_body(p, args.strategy, config.top_n) for p in build_payloads(config)]
    report = Report(command, args.seed, args.minutes, args.rate)
    log = args.out / "serve.log"
    log.write_bytes(b"")
    proc, url = start_serve(args.model_dir.resolve(), log)
    assert ipaddress.ip_address(urlsplit(url).hostname).is_loopback, url  # loopback only, by construction
    outcomes: list[Outcome] = []
    try:
        if _wait_ready(url, 180, proc) is None:
            print(f"chaos: keyrank serve never became ready; see {log}", file=sys.stderr)
            return 2
        for body in bodies[:2]:  # warm-up, not counted: the first request of a shape is slower
            httpx.post(f"{url}/rerank", json=body, timeout=args.timeout)
        print(f"chaos: serve ready at {url}; {args.rate:g} req/s for {args.minutes:g} min, {args.faults} faults (seed {args.seed})",
              flush=True)
        outcomes = asyncio.run(load(args, proc.pid, url, bodies, report, lambda: proc.poll() is None))
        report.ready_at_end_s = _wait_ready(url, 60, proc)
    finally:
        if proc.poll() is not None and not report.serve_died:
            report.serve_died = f"keyrank serve exited {proc.returncode} during the run"
        proc.send_signal(signal.SIGTERM)
        try:
            report.serve_exit = proc.wait(60)
        except Exception:  # noqa: BLE001 -- a stuck gateway must not keep the run open
            proc.kill()
            proc.wait(10)
    report.repairs = log.read_text(errors="replace").count("; repairing")
    summarise(report, outcomes)
    report.failures = verdict(report)
    (args.out / "chaos.json").write_text(json.dumps(asdict(report), indent=2))
    (args.out / "chaos.md").write_text(markdown(report))
    (args.out / "requests.json").write_text(json.dumps([asdict(o) for o in outcomes]))
    print(markdown(report), flush=True)
    return 1 if report.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
