"""``TorchScorer``: the GPU variant's model in the gateway's own process, behind the ``Scorer``
interface (like ``LocalScorer`` for ONNX Runtime).

For a GPU machine without the nvidia-pytriton wheel, for notebooks, and for the
benchmark's in-process figures. Same length buckets and batches as the Triton
path, same ``torch_encoder`` code as the Triton model, so the scores are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from keyrank.modelserver.python_models.torch_encoder import TorchCrossEncoder
from keyrank.scoring import Batch
from keyrank.scoring.buckets import LENGTH_BUCKETS, LENGTH_MULTIPLE
from keyrank.scoring.in_process import InProcessScorer


class TorchScorer(InProcessScorer):
    """The cross-encoder in PyTorch in this process (one model, one batch on the device at a time)."""

    def __init__(
        self,
        folder: str | Path,
        *,
        pad_id: int,
        device: str = "cuda",
        dtype: str = "bfloat16",
        cuda_graphs: bool = False,
        buckets: Sequence[int] = LENGTH_BUCKETS,
        batch_size: int = 64,
        max_shapes: int = 0,
        multiple: int = LENGTH_MULTIPLE,
        long_buckets: Sequence[int] = (),
    ) -> None:
        super().__init__(pad_id=pad_id, buckets=buckets, batch_size=batch_size, max_shapes=max_shapes, multiple=multiple,
                         long_buckets=long_buckets)
        self.encoder = TorchCrossEncoder(folder, device=device, dtype=dtype, cuda_graphs=cuda_graphs)
        """The model (``models/triton-embedded-cuda/cross_encoder/1``)."""

    def run_batch(self, batch: Batch, want_pooled: bool) -> tuple[np.ndarray, np.ndarray | None]:
        logits, pooled = self.encoder(batch.input_ids, batch.attention_mask, batch.token_type_ids)
        return logits, (pooled if want_pooled else None)

    @property
    def closed(self) -> bool:
        return self.encoder is None

    async def close(self) -> None:
        self.encoder = None  # type: ignore[assignment]
