"""What the in-process scorers share: the model runs in the gateway's own process, one batch at a time.

``LocalScorer`` (ONNX Runtime, scoring/local.py) and ``TorchScorer`` (PyTorch,
scoring/pytorch.py) differ only in how one padded batch is run; the length
buckets, the batches, the deadline check between batches and the answer's
shape are the same as the Triton path's, so the scores are too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np

from keyrank.errors import ScoringUnavailable
from keyrank.scoring import Batch, ModelInputs, Scores, bucket_batches, gather, relevance
from keyrank.scoring.buckets import LENGTH_BUCKETS, LENGTH_MULTIPLE


class InProcessScorer:
    """A ``Scorer`` whose model runs here; subclasses say how one batch runs (``run_batch``)."""

    def __init__(self, *, pad_id: int, buckets: Sequence[int] = LENGTH_BUCKETS, batch_size: int = 32,
                 max_shapes: int = 0, multiple: int = LENGTH_MULTIPLE, long_buckets: Sequence[int] = ()) -> None:
        self.pad_id: int = pad_id
        """Token id written after each sequence up to its width."""
        self.buckets: tuple[int, ...] = tuple(sorted(buckets))
        """Fixed widths (and the longest allowed); a sequence goes to the smallest that fits."""
        self.batch_size: int = batch_size
        """Most sequences in one run of the model."""
        self.shapes: dict[str, int] = {"max_shapes": max_shapes, "multiple": multiple}
        """Per-request widths (scoring/buckets.py); max_shapes 0 = the fixed buckets."""
        self.long_buckets: tuple[int, ...] = tuple(long_buckets)
        """Widths past the buckets, up to the model's longest input (longp; scoring/buckets.py ``long_widths``)."""
        # One run at a time: two concurrent runs would only split the same cores (or the same GPU).
        self._lock = threading.Lock()

    def run_batch(self, batch: Batch, want_pooled: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(logits, pooled or None) of one padded batch."""
        raise NotImplementedError

    async def score(self, inputs: ModelInputs, *, want_pooled: bool, deadline: float) -> Scores:
        """Scores of every sequence; a deadline that passes between batches raises ``ScoringUnavailable``."""
        return await asyncio.to_thread(self.score_sync, inputs, want_pooled=want_pooled, deadline=deadline)

    def score_sync(self, inputs: ModelInputs, *, want_pooled: bool, deadline: float | None = None) -> Scores:
        """The blocking form (training and benchmarks call it from plain code)."""
        batches = bucket_batches(inputs, buckets=self.buckets, batch_size=self.batch_size, pad_id=self.pad_id,
                                 long_buckets=self.long_buckets, **self.shapes)
        results = []
        with self._lock:
            for batch in batches:
                if deadline is not None and time.monotonic() > deadline:
                    raise ScoringUnavailable("request deadline passed while scoring")
                logits, pooled = self.run_batch(batch, want_pooled)
                results.append((relevance(logits, batch.rows.size), pooled if want_pooled else None))
        return gather(len(inputs), batches, results, want_pooled)

    async def ready(self, timeout: float = 1.0) -> bool:
        """The model is loaded (there is nothing remote to ask)."""
        return not self.closed

    @property
    def closed(self) -> bool:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError
