"""Past one Triton: the gateway's channel spreads its calls over every replica its target resolves to, a replica
that dies costs no request (UNAVAILABLE is retried on another), and one that stops answering (a lost node, a
black-holed network) is dropped within the keepalive timeout instead of when TCP gives up.

Two real tritonservers on loopback behind one gRPC target that names both (as DNS names every pod of a headless
Service); each server's own statistics say how many calls it served. The same over Docker's DNS with
``docker compose --scale``: tests/test_docker.py."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from keyrank.config import Settings

pytestmark = pytest.mark.triton

QUERY = "who chaired the budget meeting"
DOCUMENTS = ["the committee met to discuss the budget and the mayor chaired it", "a recipe for bread with flour"]


@pytest.fixture()
def two_tritons(prepared_models: Path):
    from keyrank.modelserver.embedded import EmbeddedTriton

    settings = Settings(model_dir=prepared_models, embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    with EmbeddedTriton(settings=settings, supervise=False) as a, EmbeddedTriton(settings=settings, supervise=False) as b:
        yield a, b


def _reranker(prepared_models: Path, servers, **settings):
    from keyrank import Reranker

    target = "ipv4:" + ",".join(server.grpc_url for server in servers)
    return Reranker(Settings(model_dir=prepared_models, triton_url=target, request_timeout_s=30, **settings))


def _served(servers) -> list[int]:
    return [server.admin.execution_count(server.model) or 0 for server in servers]


def _served_since(servers, before: list[int], calls: int) -> list[int]:
    """Executions per server since ``before``, read once they add up to ``calls`` or after 5 s: Triton counts an
    execution after its response has gone out, so the last call's may not be counted the moment it returns."""
    deadline = time.monotonic() + 5
    while True:
        counts = [after - b for after, b in zip(_served(servers), before)]
        if sum(counts) >= calls or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def _rank(reranker, n: int) -> list[str]:
    """``n`` small rankings (one Triton call each); the errors, if any."""
    errors = []
    for _ in range(n):
        try:
            assert reranker.rank(QUERY, DOCUMENTS, strategy="firstp").results[0].index == 0
        except Exception as exc:  # noqa: BLE001 -- counted: what the test is about
            errors.append(repr(exc)[:200])
    return errors


def test_round_robin_sends_calls_to_every_replica_and_pick_first_to_one(prepared_models, two_tritons):
    for balancing, low, high in (("round_robin", 0.4, 0.6), ("pick_first", 0.0, 0.0)):
        before = _served(two_tritons)
        reranker = _reranker(prepared_models, two_tritons, triton_balancing=balancing)
        try:
            assert _rank(reranker, 60) == []
        finally:
            reranker.close()
        counts = _served_since(two_tritons, before, 60)
        share = min(counts) / sum(counts)
        print(f"{balancing}: executions per replica {counts}")
        assert sum(counts) >= 60
        assert low <= share <= high or (balancing == "pick_first" and share == 0), (balancing, counts)


def test_a_replica_that_dies_costs_no_request(prepared_models, two_tritons):
    a, b = two_tritons
    reranker = _reranker(prepared_models, two_tritons)
    try:
        assert _rank(reranker, 10) == []
        errors: list[str] = []
        done = threading.Event()

        def load() -> None:
            while not done.is_set():
                errors.extend(_rank(reranker, 1))

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        time.sleep(0.5)
        os.kill(a.pid, signal.SIGKILL)  # as a node dies: no goodbye
        killed = _served([b])[0]
        time.sleep(2.0)
        done.set()
        loader.join(30)
        assert errors == []
        assert _served([b])[0] - killed >= 5  # the survivor took the load
    finally:
        reranker.close()


def test_a_replica_that_stops_answering_is_dropped_within_the_keepalive_timeout(prepared_models, two_tritons):
    a, b = two_tritons
    reranker = _reranker(prepared_models, two_tritons, triton_keepalive_s=1.0, triton_keepalive_timeout_s=1.0)
    try:
        assert _rank(reranker, 6) == []  # connected to both
        os.kill(a.pid, signal.SIGSTOP)  # its kernel still takes TCP, nothing answers: a black hole
        stopped = time.monotonic()
        # readiness stays true while another replica serves, before keepalive drops the silent one too
        assert all(asyncio.run_coroutine_threadsafe(reranker.ready(), reranker._loop.loop).result() for _ in range(4))
        first = _served([b])[0]
        answered = []  # (seconds after the stop, seconds the call took)
        while time.monotonic() - stopped < 6.0:
            t0 = time.monotonic()
            assert _rank(reranker, 1) == []  # a call caught on the dead connection is retried on the other
            answered.append((t0 - stopped, time.monotonic() - t0))
        slowest = max(took for _, took in answered)
        late = [took for sent, took in answered if sent > 3.0]
        print(f"black-holed replica: {len(answered)} calls in 6 s, slowest {slowest:.2f} s; after 3 s slowest "
              f"{max(late):.3f} s")
        assert slowest < 1.0 + 1.0 + 1.0  # keepalive + its timeout, and a retry
        assert max(late) < 0.5  # past keepalive + timeout no call goes to it
        assert _served_since([b], [first], len(answered))[0] >= len(answered)  # every call was answered by the replica that answers
        assert asyncio.run_coroutine_threadsafe(reranker.ready(), reranker._loop.loop).result()
    finally:
        os.kill(a.pid, signal.SIGCONT)
        reranker.close()
