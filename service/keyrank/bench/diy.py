"""The do-it-yourself baseline of `keyrank bench --gpu` and `--query`: what a user writes instead of keyrank.

sentence-transformers' ``CrossEncoder`` on the same checkpoint, in-process on the same device (fp16 on a
GPU; on CPU the backend the user picks, ``openvino`` being the fastest of `keyrank bench --peers`); MaxP by hand: each document cut into token windows that fit
next to the query (half-window stride, at most 64 windows, as keyrank's maxp),
every (query, window) pair scored with ``predict``, a document's score = its best
window. Same requests as keyrank's, one after another (it has no server).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class DiyMaxP:
    """CrossEncoder + hand-written MaxP chunking."""

    def __init__(self, checkpoint: Path, device: str, batch_size: int = 64, max_windows: int = 64, *,
                 backend: str = "torch", threads: int = 0):
        from sentence_transformers import CrossEncoder

        kwargs: dict = {}
        if device == "cpu" and threads:
            import torch

            torch.set_num_threads(threads)
        if backend == "openvino":
            kwargs = {"backend": "openvino", "model_kwargs": {"ov_config": {"INFERENCE_NUM_THREADS": threads}} if threads else {}}
        elif device == "cpu":
            import torch

            kwargs = {"model_kwargs": {"dtype": torch.float32}}  # the checkpoint's config says fp16
        self.model = CrossEncoder(str(checkpoint), device=device, max_length=512, **kwargs)
        if device.startswith("cuda"):
            self.model.model.half()  # the fp16 a user would turn on
        self.tokenizer = self.model.tokenizer
        self.batch_size = batch_size
        self.max_windows = max_windows

    def windows(self, query: str, doc: str) -> list[str]:
        q_tokens = len(self.tokenizer(query, add_special_tokens=False)["input_ids"])
        size = 512 - 3 - min(q_tokens, 32)
        enc = self.tokenizer(doc, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        if len(offsets) <= size:
            return [doc]
        starts = list(range(0, len(offsets) - size, size // 2))[: self.max_windows - 1] + [len(offsets) - size]
        return [doc[offsets[s][0] : offsets[min(s + size, len(offsets)) - 1][1]] for s in starts[: self.max_windows]]

    def rank(self, query: str, docs: Sequence[str]) -> np.ndarray:
        """One score per document: the best window's."""
        return self.rank_timed(query, docs)[0]

    def rank_timed(self, query: str, docs: Sequence[str]) -> tuple[np.ndarray, dict]:
        """``rank`` and where its time went: ms cutting windows (tokenize), ms in ``predict`` (which
        tokenizes the pairs again and runs the model), and the number of windows scored."""
        t0 = time.perf_counter()
        pairs, owner = [], []
        for i, doc in enumerate(docs):
            for window in self.windows(query, doc):
                pairs.append((query, window))
                owner.append(i)
        t1 = time.perf_counter()
        scores = np.asarray(self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False), dtype=np.float32).reshape(len(pairs), -1)[:, -1]
        t2 = time.perf_counter()
        best = np.full(len(docs), -np.inf, dtype=np.float32)
        np.maximum.at(best, np.asarray(owner), scores)
        return best, {"windows": (t1 - t0) * 1e3, "predict": (t2 - t1) * 1e3, "sequences": len(pairs)}


def measure(checkpoint: Path, device: str, requests: Sequence[tuple[str, list[str]]]) -> dict:
    """Per-query wall time over ``requests`` (after one warm-up query): p50, p99, queries/s."""
    diy = DiyMaxP(checkpoint, device)
    diy.rank(*requests[0])
    times = []
    for query, docs in requests:
        t0 = time.perf_counter()
        diy.rank(query, docs)
        times.append(time.perf_counter() - t0)
    ms = np.asarray(times) * 1000
    return {"requests": len(requests), "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "qps": len(times) / float(np.sum(times))}
