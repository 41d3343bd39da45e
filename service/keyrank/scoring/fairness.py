"""Who scores next: cheap requests ahead of expensive ones, without starving either.

Admission (keyrank/admission.py) estimates every request's cost in cross-encoder
sequences before any work. That estimate travels with the request as a context
variable (``request_cost``, set around the request's task by the HTTP layer; a
caller without one counts as cheapest) and decides, for each batch a request
sends to the model server:

- the order: a free slot goes to the waiting batch of the cheapest request
  (shortest expected first, first come first served among equals);
- how much a heavy request (costlier than ``small_sequences``) may hold: at most
  ``heavy_slots`` batches in flight at once, each of ``heavy_batch`` sequences,
  so that a small request arriving behind it waits for one short batch, not for
  the heavy request's whole queue of full batches;
- and at the model server, the batch's priority level (1 = small, 2 = heavy),
  so that Triton's own queue lets small batches pass heavy ones too.

A heavy request is never starved: its next batch waits only while cheaper ones
are waiting, and those are bounded by admission's reserve for small requests.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar

request_cost: ContextVar[float] = ContextVar("keyrank_request_cost", default=0.0)
"""The estimated cost (cross-encoder sequences) of the request whose batches are being scored."""

HIGH_PRIORITY, LOW_PRIORITY = 1, 2
"""Triton priority levels (1 is served first) of small and heavy requests' batches."""


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

    def __init__(self, slots: int, heavy_slots: int):
        self.slots = max(1, slots)
        """Batches in flight at most, over every request."""
        self.heavy_slots = max(1, min(heavy_slots, self.slots))
        """Batches of heavy requests in flight at most."""
        self.busy = 0
        """Batches in flight now."""
        self.heavy_busy = 0
        """Batches of heavy requests in flight now."""
        self._waiting: list[tuple[float, int, bool, asyncio.Future[None]]] = []  # sorted by (cost, arrival)
        self._arrivals = itertools.count()

    def _may_take(self, heavy: bool) -> bool:
        return self.busy < self.slots and (not heavy or self.heavy_busy < self.heavy_slots)

    def _take(self, heavy: bool) -> None:
        self.busy += 1
        self.heavy_busy += heavy

    @contextlib.asynccontextmanager
    async def slot(self, cost: float, heavy: bool) -> AsyncIterator[None]:
        """Hold one slot for the block; waits behind cheaper requests' batches."""
        if self._may_take(heavy):  # then no waiter could take it either: _grant would have woken it
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
