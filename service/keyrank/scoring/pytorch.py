"""``TorchScorer``: the GPU variant's model in the gateway's own process, behind the ``Scorer``
interface (like ``LocalScorer`` for ONNX Runtime).

For a GPU machine without the nvidia-pytriton wheel, for notebooks, and for the
benchmark's in-process figures. Same length buckets and batches as the Triton
path, same ``torch_encoder`` code as the Triton model, so the scores are the same.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from keyrank.errors import ScoringUnavailable
from keyrank.scoring import ModelInputs, Scores, bucket_batches, gather, relevance
from keyrank.modelserver.python_models.torch_encoder import TorchCrossEncoder


class TorchScorer:
    """The cross-encoder in PyTorch in this process (one model, one batch on the device at a time)."""

    def __init__(
        self,
        folder: str | Path,
        *,
        pad_id: int,
        device: str = "cuda",
        dtype: str = "bfloat16",
        cuda_graphs: bool = False,
        buckets: Sequence[int] = (64, 128, 256, 384, 512),
        batch_size: int = 64,
        max_shapes: int = 0,
        multiple: int = 32,
    ) -> None:
        self.encoder = TorchCrossEncoder(folder, device=device, dtype=dtype, cuda_graphs=cuda_graphs)
        """The model (``models/triton-embedded-cuda/cross_encoder/1``)."""
        self.pad_id: int = pad_id
        """Token id written after each sequence up to its width."""
        self.buckets: tuple[int, ...] = tuple(sorted(buckets))
        """Fixed widths (and the longest allowed)."""
        self.batch_size: int = batch_size
        """Most sequences in one forward pass."""
        self.shapes: dict[str, int] = {"max_shapes": max_shapes, "multiple": multiple}
        """Per-request widths (scoring/buckets.py); max_shapes 0 = the fixed buckets."""
        self._lock = threading.Lock()  # one forward at a time: concurrent ones would only split the GPU

    async def score(self, inputs: ModelInputs, *, want_pooled: bool, deadline: float) -> Scores:
        return await asyncio.to_thread(self.score_sync, inputs, want_pooled=want_pooled, deadline=deadline)

    def score_sync(self, inputs: ModelInputs, *, want_pooled: bool, deadline: float | None = None) -> Scores:
        batches = bucket_batches(inputs, buckets=self.buckets, batch_size=self.batch_size, pad_id=self.pad_id, **self.shapes)
        results = []
        with self._lock:
            for batch in batches:
                if deadline is not None and time.monotonic() > deadline:
                    raise ScoringUnavailable("request deadline passed while scoring")
                logits, pooled = self.encoder(batch.input_ids, batch.attention_mask, batch.token_type_ids)
                results.append((relevance(logits, batch.rows.size), pooled if want_pooled else None))
        return gather(len(inputs), batches, results, want_pooled)

    async def ready(self, timeout: float = 1.0) -> bool:
        return self.encoder is not None

    async def close(self) -> None:
        self.encoder = None  # type: ignore[assignment]
