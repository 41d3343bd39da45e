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
  about (``small_seen_within(yield_s)``) one batch of one sequence: a small request
  arriving behind it waits for one short batch, not for the heavy request's whole
  queue of full batches, and a heavy request alone keeps the model server as busy
  as full batches would (scoring/triton.py sizes the batch when its slot is granted);
- and the batch's priority level at the model server (1 = small, 2 = heavy),
  which only a Triton model configured with priority levels reads: the configs
  `keyrank prepare` writes have none (prepare/repositories.py: with them Triton's
  batcher left a request that came while the instance was busy queued up to 500 ms).

A heavy request is never starved: its next batch waits only while cheaper ones
are waiting, and those are bounded by admission's reserve for small requests.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar

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
        self._waiting: list[tuple[float, int, bool, asyncio.Future[None]]] = []  # sorted by (cost, arrival)
        self._arrivals = itertools.count()
        self.last_small: float = float("-inf")
        """``time.monotonic()`` when a small request's batch last asked for a slot."""
        self.pace = Pace(self.busy_seconds)
        """What the slots drain (tokens per busy second), measured from the batches that finish."""
        self._busy_since: float | None = None
        self._busy_total = 0.0

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

    def _may_take(self, heavy: bool) -> bool:
        return self.busy < self.slots and (not heavy or self.heavy_busy < self.heavy_limit())

    def _take(self, heavy: bool) -> None:
        if self.busy == 0:
            self._busy_since = time.monotonic()
        self.busy += 1
        self.heavy_busy += heavy

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

    def rows(self, seconds: float, width: int, most: int) -> int:
        """Rows of ``width`` tokens that drain in about ``seconds`` (1 until measured; at most ``most``)."""
        if self.tokens_per_s is None:
            return 1
        return max(1, min(most, int(seconds * self.tokens_per_s / max(1, width))))
