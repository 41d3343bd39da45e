"""Admission control: a cost estimate at the door, a bound on queued work, fast 429s with a
Retry-After computed from the queue, and admitted requests that meet their deadline."""

from __future__ import annotations

import asyncio
import math
import random
import time

from pathlib import Path

import httpx
import pytest
from keyrank.admission import CHARS_PER_TOKEN, AdmissionQueue, estimate_sequences
from keyrank.config import Settings
from keyrank.errors import Overloaded, TooCostly
from keyrank.resolved import RerankOptions, resolve
from keyrank.template import InputTemplate
from live_gateway import live_gateway
from prometheus_client import REGISTRY

WORDS = ("the", "farm", "makes", "cheese", "from", "milk", "while", "rivers", "carry", "boats", "past", "mills")


def _words(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n)) + "."


# --------------------------------------------------------------------------- the estimate

S = Settings(triton_url="unused")
TOKENS_1000 = "x" * int(1000 * CHARS_PER_TOKEN)  # about 1000 tokens by the door's rule
Q = "cheese"  # 2 query tokens: a window holds 512 - 2 - 4 = 506 document tokens (a RoBERTa-style frame of 4)
FRAME = 4
GATEWAY: Path | None = None
"""A prepared model's gateway folder as far as resolution looks: it has a bi-encoder (set by the fixture below)."""


@pytest.fixture(autouse=True, scope="module")
def _gateway_with_a_bi_encoder(tmp_path_factory):
    global GATEWAY
    GATEWAY = tmp_path_factory.mktemp("gateway")
    (GATEWAY / "bi_encoder").mkdir()


def _cost(strategy, selector, query, documents, settings=S, *, frame_tokens=FRAME, max_length=512, **caps) -> float:
    """Admission's estimate for the request as ``Pipeline.resolve`` decides it, under a frame of ``frame_tokens``
    (a RoBERTa-style ``<s> q </s></s> d </s>`` is 4; more tokens before the query stand in for a decoder's prompt)."""
    template = InputTemplate("roberta", max_length, (0,) * (frame_tokens - 3), (2, 2), (2,))
    resolved = resolve(RerankOptions(strategy=strategy, selector=selector, **caps), settings, template, GATEWAY)
    return estimate_sequences(resolved, query, documents)


@pytest.mark.parametrize(
    ("strategy", "selector", "expected"),
    [
        ("firstp", None, 3),  # one sequence per document
        ("keyb2", "bm25", 3),  # one sequence per document, selection on CPU
        ("keyb2", "cross", 3 + 3 * 16),  # plus every block (<= 63 tokens) scored alone: ceil(1000 / 63) = 16
        ("keyb2", "dense", 3 + 3 * 16 / 8),  # plus a bi-encoder pass over every cold block, 1/8 of a sequence each
        ("maxp", None, 3 * 3),  # windows of 506, stride 253: 1 + ceil(494 / 253) = 3
        ("parade-max", None, 3 * 3),
        ("avgp", None, 3 * 2),  # disjoint chunks of 506: 1 + ceil(494 / 506) = 2
    ],
)
def test_cost_is_estimated_per_strategy_from_characters(strategy, selector, expected):
    assert _cost(strategy, selector, Q, [TOKENS_1000] * 3, S, frame_tokens=FRAME) == expected


def test_keyb2_costs_a_sequence_per_pass_the_text_can_fill():
    passes = S.with_overrides(keyb2_passes=3)
    short = "x" * int(300 * CHARS_PER_TOKEN)
    # 1000 tokens fill two readings of 506; 300 tokens one; never more than the passes allowed
    assert _cost("keyb2", "bm25", Q, [TOKENS_1000, short], passes, frame_tokens=FRAME) == 2 + 1
    huge = "x" * int(10_000 * CHARS_PER_TOKEN)
    assert _cost("keyb2", "bm25", Q, [huge], passes, frame_tokens=FRAME) == 3


def test_keyb2_blocks_costs_its_inputs_share_of_full_ones():
    short = "x" * int(300 * CHARS_PER_TOKEN)  # 5 blocks of <= 63 tokens, all chosen and adjacent
    window = 512 - 2 - FRAME
    per_input = S.query_max_tokens + 3
    # span 4: the 5 blocks in 2 inputs; each block alone: 5 inputs, each with the query again
    assert _cost("keyb2-blocks", "bm25", Q, [short], S, frame_tokens=FRAME) == pytest.approx((5 * 63 + 2 * per_input) / window)  # bm25: no model work
    alone = S.with_overrides(keyb2_blocks_span=1)
    assert _cost("keyb2-blocks", "bm25", Q, [short], alone, frame_tokens=FRAME) == pytest.approx((5 * 63 + 5 * per_input) / window)
    # a long document: its keyb2_blocks chosen blocks may stand apart, one input each, whatever the span
    k = S.keyb2_blocks
    assert _cost("keyb2-blocks", "bm25", Q, [TOKENS_1000], S, frame_tokens=FRAME) == pytest.approx((k * 63 + k * per_input) / window)


def test_keyb2_parade_costs_its_rows_fewest_passes_unless_keyb2_passes_raises_them():
    short = "x" * int(300 * CHARS_PER_TOKEN)
    huge = "x" * int(10_000 * CHARS_PER_TOKEN)
    for strategy in ("keyb2-parade-avg", "keyb2-parade-max"):
        # keyb2_passes is 1, the rows read 2 while the text lasts; 3 when the setting says so
        assert _cost(strategy, "bm25", Q, [TOKENS_1000, short, huge], S, frame_tokens=FRAME) == 2 + 1 + 2
        assert _cost(strategy, "bm25", Q, [huge], S.with_overrides(keyb2_passes=3), frame_tokens=FRAME) == 3


def test_cost_respects_the_window_caps_and_max_tokens_per_doc():
    huge = "x" * int(100_000 * CHARS_PER_TOKEN)
    assert _cost("maxp", None, Q, [huge], S, frame_tokens=FRAME) == S.max_windows_per_doc
    assert _cost("maxp", None, Q, [huge], S, frame_tokens=FRAME, max_windows_per_doc=5) == 5
    assert _cost("maxp", None, Q, [huge], S, frame_tokens=FRAME, max_tokens_per_doc=506) == 1


def test_a_decoder_prompt_frame_shrinks_the_windows_and_raises_the_cost():
    # 2500 tokens: with a frame of 4 a window holds 506 (stride 253: 1 + ceil(1994 / 253) = 9 windows);
    # a decoder prompt of 60 tokens leaves 450 (stride 225: 1 + ceil(2050 / 225) = 11).
    doc = "x" * int(2500 * CHARS_PER_TOKEN)
    assert _cost("maxp", None, Q, [doc], S, frame_tokens=4) == 9
    assert _cost("maxp", None, Q, [doc], S, frame_tokens=60) == 11


def test_longp_is_charged_attentions_quadratic_cost_not_one_sequence():
    # One input of n tokens costs (n / 512)^2 sequences of 512: 1k -> 4, 2k -> 16, 4k -> 64; an 8k document is
    # cut to what fits next to the query (8192 - 4 - 2 = 8186 tokens) and costs (8186 / 512)^2 = 255.6.
    def doc(n: int) -> str:
        return "x" * int(n * CHARS_PER_TOKEN)

    costs = [_cost("longp", None, Q, [doc(n)], S, max_length=8192) for n in (300, 1024, 2048, 4096, 8192, 20_000)]
    assert costs[:4] == [1, 4, 16, 64] and costs[4] == costs[5] == pytest.approx((8186 / 512) ** 2)
    capped = S.with_overrides(longp_max_length=2048)
    assert _cost("longp", None, Q, [doc(4096)], capped, max_length=8192) == pytest.approx(((2048 - 6) / 512) ** 2)
    assert _cost("firstp", None, Q, [doc(8192)], S, max_length=8192) == 1  # the other strategies still read 512


def test_the_estimate_windows_a_short_model_as_the_pipeline_does():
    # A model that reads 256 tokens: the pipeline's windows hold 256 - 4 - 2 = 250 document tokens (stride 125),
    # and so do the estimate's, since both ask the resolved request's budget: 1 + ceil(2250 / 125) = 19.
    doc = "x" * int(2500 * CHARS_PER_TOKEN)
    assert _cost("maxp", None, Q, [doc], S, max_length=256) == 19


# --------------------------------------------------------------------------- the queue


def test_queue_refuses_past_its_bound_with_retry_after_from_depth_and_rate():
    queue = AdmissionQueue(Settings(triton_url="unused", max_queued_sequences=40, capacity_sequences_per_s=4.0))
    tickets = [queue.admit(10) for _ in range(4)]
    with pytest.raises(Overloaded) as refused:
        queue.admit(1)
    assert refused.value.retry_after_s == 10  # 40 queued sequences / 4 per second
    queue.release(tickets[0], completed=True)
    assert queue.depth == 30
    queue.admit(10)
    with pytest.raises(Overloaded):
        queue.admit(1)


def test_an_idle_queue_admits_a_request_larger_than_the_bound():
    queue = AdmissionQueue(Settings(triton_url="unused", max_queued_sequences=5))
    ticket = queue.admit(50)
    with pytest.raises(Overloaded):
        queue.admit(20)  # another heavy request (a small one may use its reserve: tests/test_fairness.py)
    queue.release(ticket, completed=False)
    queue.release(ticket, completed=False)  # a ticket frees its share once
    assert queue.depth == 0


def test_a_request_that_alone_cannot_meet_its_deadline_is_refused_at_the_door_saying_what_to_change():
    queue = AdmissionQueue(Settings(triton_url="unused", capacity_sequences_per_s=4.0, request_timeout_s=30))
    queue.admit(4 * 30 * 0.8)  # exactly the share of the deadline the door allows
    with pytest.raises(TooCostly) as refused:
        queue.admit(4 * 30 * 0.8 + 1)
    message = str(refused.value)
    assert "max_tokens_per_doc" in message and "KEYRANK_REQUEST_TIMEOUT_S" in message and "keyb2" in message
    assert refused.value.field == "documents"
    with pytest.raises(TooCostly):  # a shorter per-request deadline refuses sooner
        AdmissionQueue(Settings(triton_url="unused", capacity_sequences_per_s=4.0)).admit(50, deadline_s=10)


def test_unset_bound_is_the_measured_drain_rate_times_half_the_deadline(monkeypatch):
    queue = AdmissionQueue(Settings(triton_url="unused", capacity_sequences_per_s=4.0, request_timeout_s=30))
    assert queue.bound == 60  # before any measurement: the configured capacity
    clock = [100.0]
    monkeypatch.setattr("keyrank.admission.time.monotonic", lambda: clock[0])
    for _ in range(20):  # the gateway drains 40 sequences per second while busy
        ticket = queue.admit(40)
        clock[0] += 1.0
        queue.release(ticket, completed=True)
    assert 39 < queue.rate <= 40
    assert 39 * 15 < queue.bound <= 40 * 15


# --------------------------------------------------------------------------- live: overload


def _counted(outcome: str) -> float:
    labels = {"endpoint": "/rerank", "strategy": "keyb2", "outcome": outcome}
    # summed over the model label (one model here)
    return sum(s.value for family in REGISTRY.collect() if family.name == "keyrank_requests" for s in family.samples
               if s.name == "keyrank_requests_total" and labels.items() <= s.labels.items())


async def _one(client: httpx.AsyncClient, seed: int) -> tuple[int, float, str | None]:
    """One request of one 300-word document: (status, seconds, Retry-After)."""
    started = time.monotonic()
    # keyb2: one sequence a document, which the bounds below count in
    response = await client.post("/rerank", json={"query": "cheese farm", "documents": [_words(300, seed)], "strategy": "keyb2"})
    return response.status_code, time.monotonic() - started, response.headers.get("retry-after")


async def _flood(url: str, n: int) -> list[tuple[int, float, str | None]]:
    """n simultaneous requests of one 300-word document each."""
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=n)) as client:
        await client.get("/healthz")
        return await asyncio.gather(*(_one(client, i) for i in range(n)))


async def _probe_behind(url: str, big: dict, probes: int) -> tuple[int, list]:
    """``big`` fills the queue; meanwhile ``probes`` requests go one after another on a warm connection,
    so their latency is the gateway's, not that of many connections opening at once."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await client.get("/healthz")
        filling = asyncio.ensure_future(client.post("/rerank", json=big))
        # the probes start once the gateway (in this process) has admitted it, not after a guessed pause
        waited = time.monotonic()
        while not REGISTRY.get_sample_value("keyrank_queued_sequences") and time.monotonic() - waited < 30:
            await asyncio.sleep(0.005)
        probed = [await _one(client, 1000 + i) for i in range(probes)]
        return (await filling).status_code, probed


def _overload_settings(models, triton) -> Settings:
    return Settings(
        model_dir=models, triton_url=triton.grpc_url, request_timeout_s=DEADLINE_S, max_queued_sequences=12,
        capacity_sequences_per_s=4.0,
    )


DEADLINE_S = 15.0


@pytest.mark.triton
def test_overload_is_refused_and_the_admitted_meet_their_deadline(prepared_models, embedded_triton):
    with live_gateway(_overload_settings(prepared_models, embedded_triton)) as url:
        httpx.post(f"{url}/rerank", json={"query": "warm", "documents": ["up"]}, timeout=30)
        overloaded_before = _counted("overloaded")
        answers = asyncio.run(_flood(url, 40))
        metrics_text = httpx.get(f"{url}/metrics").text
    admitted = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 429]
    assert len(admitted) + len(refused) == len(answers), sorted({a[0] for a in answers})  # no 503, no 5xx
    assert 12 <= len(admitted) < 40 and len(refused) >= 10, (len(admitted), len(refused))
    assert all(seconds < DEADLINE_S for _, seconds, _ in admitted)
    assert all(retry is not None and 1 <= int(retry) <= 60 for _, _, retry in refused)
    assert _counted("overloaded") - overloaded_before == len(refused)
    assert "keyrank_queued_sequences 0.0" in metrics_text  # everything drained, nothing leaked


@pytest.mark.triton
def test_a_full_queue_refuses_in_milliseconds_with_retry_after_from_the_queue(prepared_models, embedded_triton):
    # about 15 windows by the door's estimate: more than the bound, so it is admitted only alone
    big = {"query": "cheese", "documents": [_words(3_000, 7)], "strategy": "maxp"}
    with live_gateway(_overload_settings(prepared_models, embedded_triton)) as url:
        httpx.post(f"{url}/rerank", json={"query": "warm", "documents": ["up"]}, timeout=30)
        big_status, probed = asyncio.run(_probe_behind(url, big, probes=10))
    assert big_status == 200
    assert [status for status, _, _ in probed] == [429] * 10, probed
    latencies = sorted(seconds for _, seconds, _ in probed)
    assert latencies[5] < 0.05, latencies  # refused before any tokenizing
    estimate = _cost("maxp", None, big["query"], big["documents"], Settings(triton_url="unused"), frame_tokens=3)
    assert {retry for _, _, retry in probed} == {str(math.ceil(estimate / 4))}  # queued sequences / 4 per second


# --------------------------------------------------------------------------- measuring the default


@pytest.mark.slow
@pytest.mark.triton
def test_measure_capacity(prepared_models, embedded_triton):
    """Sequences per second the embedded Triton drains (the KEYRANK_CAPACITY_SEQUENCES_PER_S default)."""
    settings = Settings(
        model_dir=prepared_models, triton_url=embedded_triton.grpc_url, request_timeout_s=120, max_queued_sequences=10_000
    )
    with live_gateway(settings) as url:
        started = time.monotonic()
        answers = asyncio.run(_flood(url, 24))
        seconds = time.monotonic() - started
        drain_rate = REGISTRY.get_sample_value("keyrank_drain_sequences_per_second")
    assert [status for status, _, _ in answers] == [200] * 24
    measured = len(answers) / seconds
    print(f"\ncapacity: {measured:.2f} sequences/s (24 x one 300-word document, keyb2); the queue measured {drain_rate:.2f}")
    # The queue's own drain rate (what sizes its bound) tracks the wall-clock rate of the same flood.
    assert measured / 2 < drain_rate < measured * 2


@pytest.mark.triton
def test_a_request_too_costly_for_its_deadline_gets_a_422_at_once_over_http(prepared_models, embedded_triton):
    # The reported case with the shipped defaults: 4 documents of ~18k tokens each, every window scored,
    # ran the full 30 s and got a 503 whose "retry after 1 s" could never succeed.
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url)
    heavy = {"query": "cheese farm", "strategy": "maxp", "documents": [_words(18_000, seed) for seed in range(4)]}
    with live_gateway(settings) as url, httpx.Client(base_url=url, timeout=60) as client:
        started = time.monotonic()
        refused = client.post("/rerank", json=heavy)
        seconds = time.monotonic() - started
        cheaper = client.post("/rerank", json={**heavy, "strategy": "keyb2"})
    assert refused.status_code == 422, refused.text
    assert seconds < 2.0, seconds  # refused at the door, before any scoring
    body = refused.json()
    assert "retry-after" not in refused.headers  # waiting never helps; changing the request does
    message = str(body)
    assert "max_tokens_per_doc" in message and "KEYRANK_REQUEST_TIMEOUT_S" in message and "keyb2" in message
    assert cheaper.status_code == 200  # the advice works: the same documents through keyb2 are served
