"""Who scores next: cheap requests ahead of expensive ones, without starving either.

Admission (keyrank/admission.py) estimates every request's cost in cross-encoder
sequences before any work. That estimate travels with the request as a context
variable (``request_cost``, set around the request's task by the HTTP layer; a
caller without one counts as cheapest) and decides, for each batch a request
sends to the model server:

- the order: a free slot goes to the waiting batch of the cheapest request
  (shortest expected first, first come first served among equals);
- how much a heavy request (costlier than ``small_sequences``) may hold: at most
  ``heavy_slots`` batches in flight at once, each as long as the gate measures the
  model server drains in ``heavy_batch_s`` (``Pace``); while small requests are
  about (``small_seen_within(yield_s)``) one batch of one sequence (scoring/triton.py
  sizes the batch when its slot is granted);
- when a heavy batch is sent: not while a small request's batch is on its way
  (``heavy_turn``), since the model server's queue is first in, first out;
- what a small batch cancels: the heavy batches queued at the model server and
  the one it computes unless that is a single sequence past half its expected time
  (``heavy_batch``, ``preempted``: their sequences are sent again). So a small request
  waits for half a heavy sequence at most, and a heavy request alone still runs in
  batches long enough to drain fast;
- and the batch's priority level at the model server (1 = small, 2 = heavy),
  which only a Triton model configured with priority levels reads: the configs
  `keyrank prepare` writes have none (prepare/repositories.py: with them Triton's
  batcher left a request that came while the instance was busy queued up to 500 ms).

A heavy request is never starved: its next batch waits only while cheaper ones
are waiting, and those are bounded by admission's reserve for small requests;
small batches in flight hold it back for ``yield_s`` at most without a break.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar

from keyrank import metrics

request_cost: ContextVar[float] = ContextVar("keyrank_request_cost", default=0.0)
"""The estimated cost (cross-encoder sequences) of the request whose batches are being scored."""

HIGH_PRIORITY, LOW_PRIORITY = 1, 2
"""Triton priority levels (1 is served first) of small and heavy requests' batches, for a model with levels."""


@contextlib.contextmanager
def costing(sequences: float) -> Iterator[None]:
    """Within the block (and the tasks and threads started in it), scoring is for a request of this cost."""
    token = request_cost.set(sequences)
    try:
        yield
    finally:
        request_cost.reset(token)


class FairGate:
    """``slots`` concurrent batches, granted cheapest request first, with at most ``heavy_slots`` to heavy ones.

    Belongs to one event loop (no lock: everything runs on it)."""

    def __init__(self, slots: int, heavy_slots: int, yield_s: float = 0.0):
        self.slots = max(1, slots)
        """Batches in flight at most, over every request."""
        self.heavy_slots = max(1, min(heavy_slots, self.slots))
        """Batches of heavy requests in flight at most."""
        self.yield_s = yield_s
        """For this long after a small request's batch, heavy requests hold one slot at most (0 = never)."""
        self.busy = 0
        """Batches in flight now."""
        self.heavy_busy = 0
        """Batches of heavy requests in flight now."""
        self.small_busy = 0
        """Batches of small requests in flight now."""
        self._small_since = 0.0  # ``time.monotonic()`` when small_busy last rose from 0
        self._waiting: list[tuple[float, int, bool, asyncio.Future[None]]] = []  # sorted by (cost, arrival)
        self._arrivals = itertools.count()
        self.last_small: float = float("-inf")
        """``time.monotonic()`` when a small request's batch last asked for a slot."""
        self.pace = Pace(self.busy_seconds)
        """What the slots drain (tokens per busy second), measured from the batches that finish."""
        self._busy_since: float | None = None
        self._busy_total = 0.0
        # The heavy batches' calls in flight, oldest first: (call, rows, time.monotonic() when sent, seconds expected).
        self._heavy_calls: list[tuple[asyncio.Future, int, float, float | None]] = []
        self._preempted: weakref.WeakSet[asyncio.Future] = weakref.WeakSet()
        self._changed: asyncio.Future[None] | None = None  # set when a batch ends (``heavy_turn`` looks again)

    def busy_seconds(self) -> float:
        """Wall time so far with at least one batch in flight."""
        ongoing = time.monotonic() - self._busy_since if self._busy_since is not None else 0.0
        return self._busy_total + ongoing

    def small_seen_within(self, seconds: float) -> bool:
        """A small request's batch asked for a slot in the last ``seconds``."""
        return time.monotonic() - self.last_small < seconds

    def yielding(self) -> bool:
        """A small request is about: its batch asked for a slot within ``yield_s``."""
        return self.small_seen_within(self.yield_s)

    def heavy_limit(self) -> int:
        """Heavy batches allowed in flight now: one while a small request is about (``yielding``), so a small batch
        waits behind one heavy batch at most, else ``heavy_slots``."""
        return 1 if self.yielding() else self.heavy_slots

    @contextlib.contextmanager
    def heavy_batch(self, call: asyncio.Future, rows: int, seconds: float | None) -> Iterator[None]:
        """Around a heavy batch's call of ``rows`` sequences to the model server, expected to take ``seconds``
        (None: not measured yet), which a small request's batch may cancel (``preempted``)."""
        entry = (call, rows, time.monotonic(), seconds)
        self._heavy_calls.append(entry)
        try:
            yield
        finally:
            self._heavy_calls.remove(entry)

    def preempted(self, call: asyncio.Future) -> bool:
        """Whether ``call`` was cancelled for a small request's batch (its sequences are to be sent again)."""
        return call in self._preempted

    def _preempt(self) -> None:
        """A small batch takes a slot: cancel the heavy calls waiting in the model server's queue (all but the
        oldest, which it is computing), and the one being computed too unless it is a single sequence past half
        its expected time: the small batch waits for half a heavy sequence at most. The model process stops a
        cancelled run within a few milliseconds (python_models/model.py); what it had computed is lost: once
        per burst of small requests for a batch of several sequences (afterwards heavy batches are single
        sequences, ``heavy_limit``), and less than half a sequence per small request after that."""
        now = time.monotonic()
        for index, (call, rows, sent, seconds) in enumerate(self._heavy_calls):
            young = seconds is not None and now - sent < seconds / 2
            if (index or rows > 1 or young) and not call.done():
                self._preempted.add(call)
                call.cancel()
                metrics.HEAVY_PREEMPTED.inc()

    async def heavy_turn(self) -> None:
        """Wait until a heavy batch may be sent (then ``slot`` grants it at once): a heavy slot free
        (``heavy_limit``) and no small request's batch in flight, unless small ones have been in flight without a
        break for ``yield_s``.

        Triton's queue is first in, first out: a heavy batch sent while a small one is on its way would run
        before it, or beside it in the same execution."""
        while True:
            now = time.monotonic()
            if self.small_busy and now < (give_up := self._small_since + self.yield_s):
                timeout: float | None = give_up - now  # the small batch's end wakes it
            elif self.heavy_busy >= self.heavy_limit():
                timeout = None  # a heavy batch's end wakes it
            else:
                return
            if self._changed is None or self._changed.done():
                self._changed = asyncio.get_running_loop().create_future()
            await asyncio.wait([self._changed], timeout=timeout)

    def _wake_heavy(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    def _may_take(self, heavy: bool) -> bool:
        return self.busy < self.slots and (not heavy or self.heavy_busy < self.heavy_limit())

    def _take(self, heavy: bool) -> None:
        if self.busy == 0:
            self._busy_since = time.monotonic()
        self.busy += 1
        self.heavy_busy += heavy
        if not heavy:
            if not self.small_busy:
                self._small_since = time.monotonic()
            self.small_busy += 1
            self._preempt()

    @contextlib.asynccontextmanager
    async def slot(self, cost: float, heavy: bool) -> AsyncIterator[None]:
        """Hold one slot for the block; waits behind cheaper requests' batches."""
        if not heavy:
            self.last_small = time.monotonic()
        if self._may_take(heavy):  # then no waiter could take it either (but a heavy one whose yield just ended)
            self._take(heavy)
        else:
            entry = (cost, next(self._arrivals), heavy, asyncio.get_running_loop().create_future())
            bisect.insort(self._waiting, entry, key=lambda e: e[:2])
            try:
                await entry[3]  # granted: the slot was taken for us by _grant
            except BaseException:
                if entry[3].done() and not entry[3].cancelled():
                    self._release(heavy)  # granted and cancelled in the same turn: give it back
                else:
                    self._waiting.remove(entry)
                    self._grant()  # a heavy waiter at the head may have blocked cheaper ones behind it
                raise
        try:
            yield
        finally:
            self._release(heavy)

    def _release(self, heavy: bool) -> None:
        self.busy -= 1
        self.heavy_busy -= heavy
        self.small_busy -= not heavy
        self._wake_heavy()
        if self.busy == 0 and self._busy_since is not None:
            self._busy_total += time.monotonic() - self._busy_since
            self._busy_since = None
        self._grant()

    def _grant(self) -> None:
        """Wake the cheapest waiters that may take a slot now (a heavy one waits while heavy slots are full,
        and does not hold back the cheaper or small ones behind it)."""
        i = 0
        while i < len(self._waiting) and self.busy < self.slots:
            cost, _, heavy, future = self._waiting[i]
            if self._may_take(heavy):
                del self._waiting[i]
                self._take(heavy)
                future.set_result(None)
            else:
                i += 1


class Pace:
    """Tokens (rows x padded width) per second the model server drains for this process while it has work
    from it: a moving average over windows of ``window_s`` busy seconds; None until the first window."""

    def __init__(self, busy_seconds, window_s: float = 0.5, smoothing: float = 0.3):
        self._busy_seconds = busy_seconds
        self.window_s = window_s
        self.smoothing = smoothing
        self.tokens_per_s: float | None = None
        self._tokens = 0
        self._mark = 0.0

    def done(self, tokens: int) -> None:
        """A batch of ``tokens`` finished."""
        self._tokens += tokens
        busy = self._busy_seconds() - self._mark
        if busy >= self.window_s:
            sample = self._tokens / busy
            old = self.tokens_per_s
            self.tokens_per_s = sample if old is None else (1 - self.smoothing) * old + self.smoothing * sample
            self._tokens, self._mark = 0, self._mark + busy

    def seconds(self, tokens: int) -> float | None:
        """How long the model server takes for ``tokens`` (None until measured)."""
        return None if self.tokens_per_s is None else tokens / self.tokens_per_s

    def rows(self, seconds: float, width: int, most: int) -> int:
        """Rows of ``width`` tokens that drain in about ``seconds`` (1 until measured; at most ``most``)."""
        if self.tokens_per_s is None:
            return 1
        return max(1, min(most, int(seconds * self.tokens_per_s / max(1, width))))
