"""The cross-encoder in-process with ONNX Runtime: no Triton, for notebooks, tests
and small CPU deployments (``Reranker.local``). Same ``model.onnx``, same
length buckets and batches as the Triton path, so the scores are the same.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from keyrank.errors import ScoringUnavailable
from keyrank.scoring import ModelInputs, Scores, bucket_batches, gather, relevance


class LocalScorer:
    """An ONNX Runtime session on this process's CPU (or a CUDA provider when asked)."""

    def __init__(
        self,
        onnx_path: str | Path,
        *,
        pad_id: int,
        buckets: Sequence[int] = (64, 128, 256, 384, 512),
        batch_size: int = 32,
        threads: int = 0,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        max_shapes: int = 0,
        multiple: int = 32,
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or len(os.sched_getaffinity(0))
        options.inter_op_num_threads = 1  # one chain of ops: the parallelism is inside them
        self.session = ort.InferenceSession(str(onnx_path), options, providers=list(providers))
        """The ONNX Runtime session."""
        self.input_names: tuple[str, ...] = tuple(i.name for i in self.session.get_inputs())
        """Inputs the graph declares (all three for exports of `keyrank prepare`)."""
        self.pad_id: int = pad_id
        """Token id written after each sequence up to its bucket length."""
        self.buckets: tuple[int, ...] = tuple(sorted(buckets))
        """Padded lengths; a sequence goes to the smallest that fits."""
        self.batch_size: int = batch_size
        """Most sequences in one session run."""
        self.shapes: dict[str, int] = {"max_shapes": max_shapes, "multiple": multiple}
        """Per-request widths (scoring/buckets.py); max_shapes 0 = the fixed buckets."""
        # One run at a time: ORT sessions are thread-safe, but two runs would split the same cores.
        self._lock = threading.Lock()

    async def score(self, inputs: ModelInputs, *, want_pooled: bool, deadline: float) -> Scores:
        """Scores of every sequence; a deadline that passes between batches raises ``ScoringUnavailable``."""
        return await asyncio.to_thread(self.score_sync, inputs, want_pooled=want_pooled, deadline=deadline)

    def score_sync(self, inputs: ModelInputs, *, want_pooled: bool, deadline: float | None = None) -> Scores:
        """The blocking form (training and benchmarks call it from plain code)."""
        batches = bucket_batches(inputs, buckets=self.buckets, batch_size=self.batch_size, pad_id=self.pad_id, **self.shapes)
        outputs = ["logits", "pooled"] if want_pooled else ["logits"]
        results = []
        with self._lock:
            for batch in batches:
                if deadline is not None and time.monotonic() > deadline:
                    raise ScoringUnavailable("request deadline passed while scoring")
                feeds = {k: v for k, v in batch.feeds().items() if k in self.input_names}
                answer = self.session.run(outputs, feeds)
                results.append((relevance(answer[0], batch.rows.size), answer[1] if want_pooled else None))
        return gather(len(inputs), batches, results, want_pooled)

    async def ready(self, timeout: float = 1.0) -> bool:
        return self.session is not None

    async def close(self) -> None:
        self.session = None  # type: ignore[assignment]
