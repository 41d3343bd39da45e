"""Small requests never wait behind a heavy one: admission keeps a reserve for them, their batches are
scored first (shortest expected first), and a heavy request sends short batches one at a
time on the embedded CPU Triton, so a small one behind it waits for one sequence's work, not for its queue.
The heavy request still finishes inside its deadline."""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time

import httpx
import pytest
from keyrank.admission import AdmissionQueue
from keyrank.config import Settings
from keyrank.errors import Overloaded
from keyrank.scoring import fairness
from keyrank.scoring.fairness import FairGate
from live_gateway import gateway_process, live_gateway
from shared_data import CE_MODEL, linked_copy

# --------------------------------------------------------------------------- the gate


def _run(coro):
    return asyncio.run(coro)


async def _hold(gate: FairGate, cost: float, heavy: bool, order: list, release: asyncio.Event, name: str):
    async with gate.slot(cost, heavy):
        order.append(name)
        await release.wait()


def test_a_free_slot_goes_to_the_cheapest_waiting_request_first():
    async def scenario():
        gate, order, release = FairGate(slots=1, heavy_slots=1), [], asyncio.Event()
        first = asyncio.create_task(_hold(gate, 100, True, order, release, "heavy-1"))
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(_hold(gate, cost, cost > 16, order, release, name))
                   for cost, name in ((100, "heavy-2"), (5, "small-5"), (3, "small-3"), (5, "small-5b"))]
        await asyncio.sleep(0)
        assert order == ["heavy-1"] and gate.busy == 1
        release.set()
        await asyncio.gather(first, *waiting)
        return order

    assert _run(scenario()) == ["heavy-1", "small-3", "small-5", "small-5b", "heavy-2"]


def test_heavy_requests_hold_at_most_their_slots_and_never_block_a_small_one():
    async def scenario():
        gate, order, release = FairGate(slots=3, heavy_slots=1), [], asyncio.Event()
        a = asyncio.create_task(_hold(gate, 200, True, order, release, "heavy-a"))
        b = asyncio.create_task(_hold(gate, 150, True, order, release, "heavy-b"))
        await asyncio.sleep(0)
        c = asyncio.create_task(_hold(gate, 2, False, order, release, "small"))
        await asyncio.sleep(0)
        assert order == ["heavy-a", "small"]  # heavy-b waits for the heavy slot, the small one does not
        assert (gate.busy, gate.heavy_busy) == (2, 1)
        release.set()
        await asyncio.gather(a, b, c)
        return gate

    gate = _run(scenario())
    assert (gate.busy, gate.heavy_busy) == (0, 0)


def test_a_cancelled_waiter_leaves_the_queue_and_its_turn_passes_on():
    async def scenario():
        gate, order, release = FairGate(slots=1, heavy_slots=1), [], asyncio.Event()
        holder = asyncio.create_task(_hold(gate, 1, False, order, release, "holder"))
        await asyncio.sleep(0)
        gone = asyncio.create_task(_hold(gate, 1, False, order, release, "gone"))
        after = asyncio.create_task(_hold(gate, 50, True, order, release, "after"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(holder, after)
        return order, gate

    order, gate = _run(scenario())
    assert order == ["holder", "after"] and gate.busy == 0


# --------------------------------------------------------------------------- admission's reserve


class _Clock:
    def __init__(self):
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def test_the_gate_measures_what_its_slots_drain_over_busy_time_only(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(fairness, "time", clock)

    async def scenario():
        gate, order, release = FairGate(slots=2, heavy_slots=2), [], asyncio.Event()
        assert gate.pace.rows(0.05, 512, 32) == 1  # nothing measured yet: one sequence
        a = asyncio.create_task(_hold(gate, 100, True, order, release, "a"))
        b = asyncio.create_task(_hold(gate, 100, True, order, release, "b"))
        await asyncio.sleep(0)
        clock.now += 0.25  # both in flight: a quarter second of busy time, counted once
        release.set()
        await asyncio.gather(a, b)
        clock.now += 10.0  # idle: not busy time
        assert gate.busy_seconds() == pytest.approx(0.25)
        gate.pace.done(4096)  # under the 0.5 s window: no figure yet
        assert gate.pace.tokens_per_s is None
        release.clear()
        c = asyncio.create_task(_hold(gate, 100, True, order, release, "c"))
        await asyncio.sleep(0)
        clock.now += 0.25
        gate.pace.done(4096)  # 8192 tokens in 0.5 busy seconds
        release.set()
        await c
        return gate

    gate = _run(scenario())
    assert gate.pace.tokens_per_s == pytest.approx(16384)
    assert gate.pace.rows(0.05, 512, 32) == 1  # 819 tokens in 50 ms: one 512-token row
    assert gate.pace.rows(0.25, 512, 32) == 8 and gate.pace.rows(0.25, 128, 32) == 32 and gate.pace.rows(1, 512, 4) == 4


def test_a_small_batch_marks_the_gate_and_a_heavy_one_does_not(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(fairness, "time", clock)

    async def scenario():
        gate, order, release = FairGate(slots=2, heavy_slots=1), [], asyncio.Event()
        release.set()
        await _hold(gate, 100, True, order, release, "heavy")
        assert not gate.small_seen_within(1.0)
        await _hold(gate, 3, False, order, release, "small")
        clock.now += 0.5
        assert gate.small_seen_within(1.0) and not gate.small_seen_within(0.4)

    _run(scenario())


def test_heavy_requests_hold_one_slot_while_a_small_one_is_about(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(fairness, "time", clock)

    async def scenario():
        gate, order, release = FairGate(slots=4, heavy_slots=2, yield_s=1.0), [], asyncio.Event()
        assert gate.heavy_limit() == 2
        done = asyncio.Event()
        done.set()
        await _hold(gate, 3, False, order, done, "small")  # a small batch: heavy requests yield for a second
        a = asyncio.create_task(_hold(gate, 100, True, order, release, "heavy-a"))
        b = asyncio.create_task(_hold(gate, 100, True, order, release, "heavy-b"))
        await asyncio.sleep(0)
        assert order == ["small", "heavy-a"] and gate.heavy_limit() == 1
        clock.now += 1.5  # the small request is gone: heavy-b may take the second slot at the next grant
        release.set()
        await asyncio.gather(a, b)
        assert order == ["small", "heavy-a", "heavy-b"] and gate.heavy_limit() == 2

    _run(scenario())


def test_small_requests_are_admitted_from_their_reserve_while_a_heavy_one_fills_the_bound():
    queue = AdmissionQueue(Settings(triton_url="unused", max_queued_sequences=100, small_request_sequences=16,
                                    capacity_sequences_per_s=100))
    heavy = queue.admit(90)
    with pytest.raises(Overloaded):
        queue.admit(40)  # another heavy one: over the bound
    small = [queue.admit(6) for _ in range(4)]  # 24 <= the reserve of 25, though 90 + 24 > 100
    with pytest.raises(Overloaded):
        queue.admit(6)
    for ticket in small + [heavy]:
        queue.release(ticket, completed=True)
    assert queue.depth == 0 and queue.small_depth == 0


def test_a_heavy_batch_waits_while_a_small_one_is_in_flight_but_no_longer_than_the_yield():
    async def scenario(small_holds_s: float) -> float:
        gate, release = FairGate(slots=4, heavy_slots=2, yield_s=0.3), asyncio.Event()

        async def small():
            async with gate.slot(3, False):
                await asyncio.sleep(small_holds_s)

        task = asyncio.create_task(small())
        await asyncio.sleep(0.01)
        t0 = time.monotonic()
        await gate.heavy_turn()
        waited = time.monotonic() - t0
        await task
        return waited

    assert 0.04 < _run(scenario(0.06)) < 0.2  # until the small batch ended
    assert 0.25 < _run(scenario(1.0)) < 0.6  # small batches in flight without a break: no longer than yield_s


def test_a_small_batch_cancels_the_heavy_calls_queued_and_a_running_one_of_several_sequences():
    async def scenario(running_rows: int, expected_s: float | None, ran_s: float) -> tuple[bool, bool]:
        gate = FairGate(slots=4, heavy_slots=2)
        loop = asyncio.get_running_loop()
        running, queued = loop.create_future(), loop.create_future()
        with gate.heavy_batch(running, running_rows, expected_s):
            await asyncio.sleep(ran_s)
            with gate.heavy_batch(queued, 1, expected_s):
                async with gate.slot(3, False):
                    pass
        return running.cancelled() and gate.preempted(running), queued.cancelled() and gate.preempted(queued)

    assert _run(scenario(1, 0.05, 0.04)) == (False, True)  # one sequence past half its time: the small batch waits
    assert _run(scenario(1, None, 0.0)) == (False, True)  # not measured yet: it waits too
    assert _run(scenario(1, 0.5, 0.0)) == (True, True)  # one sequence just started: cancelled, half is left at most
    assert _run(scenario(4, 0.2, 0.15)) == (True, True)  # several sequences: cancelled whatever their progress


# --------------------------------------------------------------------------- live, on the embedded CPU Triton

WORDS = ("the", "budget", "of", "remote", "control", "was", "agreed", "after", "a", "long", "meeting", "about",
         "buttons", "colours", "and", "batteries", "marketing", "design")


def _text(chars: int, seed: int) -> str:
    rng = random.Random(seed)
    words: list[str] = []
    length = 0
    while length < chars:
        words.append(rng.choice(WORDS))
        length += len(words[-1]) + 1
    return " ".join(words)[:chars]


def _heavy(docs: int) -> dict:
    return {"query": "remote control budget", "strategy": "maxp", "documents": [_text(12_000, i) for i in range(docs)]}


SMALL = {"query": "remote control budget", "strategy": "keyb2", "selector": "bm25",
         "documents": [_text(1_000, 100 + i) for i in range(3)]}


def _settings(models, triton) -> Settings:
    # The embedded Triton's id makes this the embedded deployment (heavy batches of one sequence, one at a time);
    # capacity lets the heavy request in: it is heavy, not too costly.
    return Settings(model_dir=models, triton_url=triton.grpc_url, triton_server_id=triton.server_id,
                    capacity_sequences_per_s=20.0, request_timeout_s=60.0)


async def _small_while_heavy(url: str, heavy: dict, smalls: int | None, gap_s: float
                             ) -> tuple[tuple[int, float, dict], list[tuple[int, float]]]:
    """A heavy request, and after 1 s ``smalls`` small ones one after another, ``gap_s`` apart; ``smalls`` None:
    from 0.1 s on for as long as the heavy one runs. (heavy status, seconds, scores by index), [(status, seconds)]."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def timed(body: dict) -> tuple[int, float, dict]:
            t0 = time.perf_counter()
            response = await client.post("/rerank", json=body)
            seconds = time.perf_counter() - t0
            scores = {r["index"]: r["relevance_score"] for r in response.json().get("results", [])}
            return response.status_code, seconds, scores

        heavy_task = asyncio.create_task(timed(heavy))
        await asyncio.sleep(1.0 if smalls is not None else 0.1)  # the heavy request is being scored
        small = []
        while not heavy_task.done() if smalls is None else len(small) < smalls:
            status, seconds, _ = await timed(SMALL)
            small.append((status, seconds))
            await asyncio.sleep(gap_s)
        return await heavy_task, small


async def _idle(url: str, n: int) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            assert (await client.post("/rerank", json=SMALL)).status_code == 200
            out.append(time.perf_counter() - t0)
        return out


@pytest.mark.triton
def test_small_requests_are_answered_while_a_heavy_one_runs_and_the_heavy_one_completes(prepared_models, embedded_triton):
    with live_gateway(_settings(prepared_models, embedded_triton)) as url:
        idle = asyncio.run(_idle(url, 3))
        (heavy_status, heavy_s, _), small = asyncio.run(_small_while_heavy(url, _heavy(6), smalls=5, gap_s=0.2))
    assert heavy_status == 200
    assert [status for status, _ in small] == [200] * 5
    # First in, first out, each small request waited for the rest of the heavy one (seconds); now for at most
    # one sequence's work. The bound is loose for a busy 2-core machine; the slow test below measures p95.
    assert max(seconds for _, seconds in small) < max(1.0, 5 * max(idle)), (small, idle, heavy_s)
    assert max(seconds for _, seconds in small) < heavy_s / 4, (small, heavy_s)


async def _alone(url: str) -> tuple[float, dict]:
    """The heavy request alone: (seconds, scores by index)."""
    body = _heavy(12)  # built before the clock starts: it took 0.6 s when its text was built quadratically
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        t0 = time.perf_counter()
        response = await client.post("/rerank", json=body)
        seconds = time.perf_counter() - t0
        assert response.status_code == 200
        return seconds, {r["index"]: r["relevance_score"] for r in response.json()["results"]}


@pytest.fixture(scope="module")
def served_default(prepared_models, tmp_path_factory):
    """The models as `make prepare` leaves them (the CPU variant ``auto`` picks: openvino-bf16 on a CPU with
    bf16; the suite's own are fused), on an embedded Triton of their own."""
    from keyrank.modelserver.embedded import EmbeddedTriton
    from keyrank.prepare.export import prepare

    out = linked_copy(prepared_models, tmp_path_factory.mktemp("auto") / "models")
    variant = prepare(str(CE_MODEL), out)["cross_encoder"]["cpu"]["variant"]
    settings = Settings(model_dir=out, embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    with EmbeddedTriton(settings=settings) as server:
        yield out, server, variant


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.timeout(1800)
def test_measure_small_request_latency_behind_a_heavy_one(served_default):
    """The figures in docs/RELIABILITY.md ("Fairness"): ``pytest tests/test_fairness.py -m slow -s``. Idle and
    loaded measurements alternate in rounds, so a change in the machine's other load hits both alike; the
    heavy request alone in the defaults' sized batches and in full batches (32 sequences, 8 in flight)
    alternate too, each after one run that warms it. The gateway runs as ``keyrank serve`` in its own process,
    as deployed, on the test's embedded Triton."""
    models, triton, variant = served_default
    rounds = 5
    idle: list[float] = []
    loaded: list[tuple[int, float]] = []
    heavy: list[tuple[int, float]] = []
    alone: list[float] = []
    full: list[float] = []
    differences: list[float] = []
    defaults = {"model_dir": models, "triton_url": triton.grpc_url, "triton_server_id": triton.server_id,
                "capacity_sequences_per_s": 20.0, "request_timeout_s": 60.0}  # as _settings
    full_batches = {**defaults, "heavy_batch_size": 32, "heavy_in_flight": 8}
    for _ in range(rounds):
        with gateway_process(defaults) as url:  # its own process, as deployed: the client shares no interpreter with it
            asyncio.run(_idle(url, 3))  # warm
            idle += asyncio.run(_idle(url, 10))
            # small requests every 0.1 s for the whole heavy run, as a busy search backend sends them
            with_heavy, small = asyncio.run(_small_while_heavy(url, _heavy(12), smalls=None, gap_s=0.1))
            heavy.append(with_heavy[:2])
            loaded += small
            asyncio.run(_alone(url))  # warm: the pace is measured
            seconds, scores = asyncio.run(_alone(url))
            alone.append(seconds)
            # preempted batches are sent again: the heavy request gets the scores it gets alone
            differences.append(max(abs(with_heavy[2].get(i, float("inf")) - score) for i, score in scores.items()))
        with gateway_process(full_batches) as url:
            asyncio.run(_alone(url))
            full.append(asyncio.run(_alone(url))[0])
    p95 = lambda xs: statistics.quantiles(xs, n=20)[-1]
    loaded_s = [seconds for _, seconds in loaded]
    idle_p95, loaded_p95 = p95(idle), p95(loaded_s)
    print(f"\nserved CPU variant {variant}; small keyb2 (3 x 1k chars), {rounds} rounds of 10: idle p50 "
          f"{statistics.median(idle):.3f} s p95 {idle_p95:.3f} s; behind a heavy maxp (12 x 12k chars): p50 "
          f"{statistics.median(loaded_s):.3f} s p95 {loaded_p95:.3f} s ({loaded_p95 / idle_p95:.2f}x); statuses "
          f"{sorted({st for st, _ in loaded})}; heavy {sorted({st for st, _ in heavy})} in "
          f"{statistics.median([s for _, s in heavy]):.1f} s (median) with the small ones; alone (median of {rounds}) "
          f"{statistics.median(alone):.2f} s in sized batches {sorted(round(a, 2) for a in alone)}, "
          f"{statistics.median(full):.2f} s in full batches {sorted(round(f, 2) for f in full)} "
          f"({statistics.median(alone) / statistics.median(full):.2f}x the time); {len(loaded)} small requests; heavy's "
          f"scores with the small ones vs alone: max |diff| {max(differences):.4f}; load average {os.getloadavg()[0]:.1f}")
    assert all(st == 200 for st, _ in heavy) and all(st == 200 for st, _ in loaded)
    assert max(differences) < 0.05  # bf16: a row's score may move by batch companions' shapes, never by a cancel
    assert loaded_p95 <= 2 * idle_p95
    assert statistics.median(alone) <= 1.1 * statistics.median(full)
