"""Stage 0, at the door: admit a request only if the work already admitted can drain in time.

In the style of text-embeddings-inference's queue bound: every request's cost is
estimated from its resolved options (resolved.py: the strategy's cut, the
selector, the caps and the model's frame) and character counts, before any
tokenizing, in cross-encoder sequences; a request that alone could not finish
inside its deadline at the measured rate is refused at once with a 422 that
says what to change; admitted, unfinished work is bounded, and a request that
would exceed the bound is answered 429 at once, with a ``Retry-After`` that is
the time the work queued now needs to drain at the measured rate. Deadline
503s stay for outages: what is admitted can finish inside its deadline.

The bound is ``KEYRANK_MAX_QUEUED_SEQUENCES`` or, unset, the measured drain
rate times half the request deadline (the other half is margin for the
estimate and the CPU stages). Until a rate is measured,
``KEYRANK_CAPACITY_SEQUENCES_PER_S`` stands in for it. Its default, 4
sequences/s, is what the embedded CPU Triton drained on the reference machine
(2 cores, MiniLM-L6, 300-word documents = one sequence each): 3.5 seq/s with 8
concurrent requests of 10 documents while other jobs shared the cores (16
concurrent requests already missed the 30 s deadline), 1.8 seq/s under twice
that load. ``pytest tests/test_api_admission.py -m slow -s -k measure``
re-measures it; a GPU Triton drains hundreds, so set it (or the bound) there.

One queue per gateway process, on its event loop (no lock needed).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from keyrank import metrics
from keyrank.config import Settings
from keyrank.errors import Overloaded, TooCostly
from keyrank.resolved import Resolved

CHARS_PER_TOKEN = 4.0
"""Characters per token of English prose under BERT/RoBERTa-style vocabularies (~4, the figure
OpenAI and Hugging Face quote); over-estimating the token count of code or numbers is the safe side."""

_RATE_SAMPLE_S = 1.0
"""Busy time over which one drain-rate sample is taken."""
_RATE_SMOOTHING = 0.3
"""Weight of a new sample in the moving average of the drain rate."""
_MAX_RETRY_AFTER_S = 60
"""Retry-After is capped: past a minute a client should rather fail over than wait."""
DEADLINE_SHARE = 0.8
"""A request alone may need at most this share of its deadline at the measured rate; the rest is margin
for the estimate and the CPU stages. Past it, it is refused at the door (``TooCostly``)."""


def estimate_sequences(resolved: Resolved, query: str, documents: Sequence[str]) -> float:
    """Cross-encoder sequences (of up to 512 tokens) the request will cost, from character counts only.

    Tokens are guessed from characters (``CHARS_PER_TOKEN``), cut to the request's ``max_tokens_per_doc``;
    the rest is the resolved request's own arithmetic: the model's frame decides how many document tokens
    one input holds (``Resolved.budget``), and the strategy's cut counts the inputs with the stride and caps
    it cuts with (strategies/cuts.py: a prefix one per document, windows by stride up to the cap, blocks one
    reading per pass the text can fill plus the selector's ``sequences_per_block`` for every block).
    """
    chars = np.fromiter((len(d) for d in documents), dtype=np.float64, count=len(documents))
    tokens = np.ceil(chars / CHARS_PER_TOKEN)
    if resolved.max_tokens_per_doc is not None:
        tokens = np.minimum(tokens, resolved.max_tokens_per_doc)
    query_tokens = min(math.ceil(len(query) / CHARS_PER_TOKEN), resolved.settings.query_max_tokens)
    return resolved.spec.cut.sequences(tokens, resolved.budget(query_tokens), resolved.settings, resolved.max_windows,
                                       resolved.selector)


@dataclass(slots=True)
class Ticket:
    """One admitted request's share of the queue, returned by ``release``."""

    sequences: float
    """The request's estimated cost."""
    small: bool = False
    """Admitted as a small request (``small_request_sequences``), from the small requests' reserve if need be."""
    released: bool = False
    """Set by ``release``: a ticket frees its share once."""


class AdmissionQueue:
    """Bounded admitted work, with the drain rate measured from what finishes."""

    def __init__(self, settings: Settings):
        self.fixed_bound: int | None = settings.max_queued_sequences
        """KEYRANK_MAX_QUEUED_SEQUENCES, or None to size the bound from the drain rate."""
        self.wait_budget_s: float = settings.request_timeout_s / 2
        """How long admitted work may wait to drain: half the deadline."""
        self.deadline_s: float = settings.request_timeout_s
        """The service's request deadline (KEYRANK_REQUEST_TIMEOUT_S)."""
        self.rate: float = settings.capacity_sequences_per_s
        """Sequences per second drained while busy (moving average; seeded from the settings)."""
        self.depth: float = 0.0
        """Estimated sequences admitted and not finished."""
        self.small_sequences: float = settings.small_request_sequences
        """Requests estimated at most this costly are small: a heavy request cannot take their reserve."""
        self.small_depth: float = 0.0
        """Estimated sequences of small requests admitted and not finished."""
        self._busy_since: float | None = None
        self._sample_busy_s = 0.0
        self._sample_sequences = 0
        metrics.QUEUED_SEQUENCES.set(0)
        metrics.DRAIN_RATE.set(self.rate)

    @property
    def bound(self) -> int:
        """Most sequences admitted at once."""
        if self.fixed_bound is not None:
            return self.fixed_bound
        return max(1, int(self.rate * self.wait_budget_s))

    @property
    def small_reserve(self) -> float:
        """Sequences of small requests admitted whatever heavy work is queued: a quarter of the bound (their
        batches go first, scoring/fairness.py, so they drain first)."""
        return self.bound / 4

    def retry_after_s(self) -> int:
        """Seconds until the work queued now has drained at the measured rate (1..60)."""
        return min(_MAX_RETRY_AFTER_S, max(1, math.ceil(self.depth / self.rate)))

    def admit(self, sequences: float, deadline_s: float | None = None) -> Ticket:
        """A ticket; ``TooCostly`` when the request alone cannot finish inside its deadline at the measured
        rate (no retry would help); ``Overloaded`` when the bound on queued work would be passed."""
        deadline_s = deadline_s or self.deadline_s
        needed_s = sequences / self.rate
        if needed_s > DEADLINE_SHARE * deadline_s:
            raise TooCostly(
                f"this request needs about {sequences:.0f} cross-encoder sequences, {needed_s:.0f} s at the measured "
                f"{self.rate:.1f} sequences/s, more than its {deadline_s:.0f} s deadline allows; send fewer or shorter "
                f"documents, set max_tokens_per_doc (or max_chunks_per_doc), use a cheaper strategy (keyb2 with bm25 or "
                f"firstp read one sequence per document), or raise the deadline (KEYRANK_REQUEST_TIMEOUT_S)",
                field="documents",
            )
        small = sequences <= self.small_sequences
        over = self.depth > 0 and self.depth + sequences > self.bound
        if over and not (small and self.small_depth + sequences <= self.small_reserve):
            raise Overloaded(
                f"the gateway is at capacity ({self.depth:.0f} sequences queued, bound {self.bound}); "
                f"this request needs about {sequences:.0f}",
                retry_after_s=self.retry_after_s(),
            )
        if self.depth == 0:
            self._busy_since = time.monotonic()
        self.depth += sequences
        self.small_depth += sequences if small else 0.0
        metrics.QUEUED_SEQUENCES.set(self.depth)
        return Ticket(sequences, small)

    def release(self, ticket: Ticket, *, completed: bool) -> None:
        """Free the ticket's share; ``completed`` work counts towards the drain rate."""
        if ticket.released:
            return
        ticket.released = True
        self.depth -= ticket.sequences
        self.small_depth -= ticket.sequences if ticket.small else 0.0
        metrics.QUEUED_SEQUENCES.set(self.depth)
        if completed:
            self._sample_sequences += ticket.sequences
        now = time.monotonic()
        if self._busy_since is not None:
            self._sample_busy_s += now - self._busy_since
            self._busy_since = now if self.depth > 0 else None
        if self._sample_busy_s >= _RATE_SAMPLE_S and self._sample_sequences:
            sample = self._sample_sequences / self._sample_busy_s
            self.rate = (1 - _RATE_SMOOTHING) * self.rate + _RATE_SMOOTHING * sample
            metrics.DRAIN_RATE.set(self.rate)
            self._sample_busy_s, self._sample_sequences = 0.0, 0
