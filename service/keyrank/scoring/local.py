"""The cross-encoder in-process with ONNX Runtime: no Triton, for notebooks, tests
and small CPU deployments (``Reranker.local``). Same ``model.onnx``, same
length buckets and batches as the Triton path, so the scores are the same.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from keyrank.scoring import Batch
from keyrank.scoring.buckets import LENGTH_BUCKETS, LENGTH_MULTIPLE
from keyrank.scoring.in_process import InProcessScorer


class LocalScorer(InProcessScorer):
    """An ONNX Runtime session on this process's CPU (or a CUDA provider when asked)."""

    def __init__(
        self,
        onnx_path: str | Path,
        *,
        pad_id: int,
        buckets: Sequence[int] = LENGTH_BUCKETS,
        batch_size: int = 32,
        threads: int = 0,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        max_shapes: int = 0,
        multiple: int = LENGTH_MULTIPLE,
    ) -> None:
        import onnxruntime as ort

        super().__init__(pad_id=pad_id, buckets=buckets, batch_size=batch_size, max_shapes=max_shapes, multiple=multiple)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or len(os.sched_getaffinity(0))
        options.inter_op_num_threads = 1  # one chain of ops: the parallelism is inside them
        self.session = ort.InferenceSession(str(onnx_path), options, providers=list(providers))
        """The ONNX Runtime session."""
        self.input_names: tuple[str, ...] = tuple(i.name for i in self.session.get_inputs())
        """Inputs the graph declares (all three for exports of `keyrank prepare`)."""

    def run_batch(self, batch: Batch, want_pooled: bool) -> tuple[np.ndarray, np.ndarray | None]:
        feeds = {k: v for k, v in batch.feeds().items() if k in self.input_names}
        answer = self.session.run(["logits", "pooled"] if want_pooled else ["logits"], feeds)
        return answer[0], (answer[1] if want_pooled else None)

    @property
    def closed(self) -> bool:
        return self.session is None

    async def close(self) -> None:
        self.session = None  # type: ignore[assignment]
