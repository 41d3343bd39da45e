"""Trained aggregators (PARADE-Attn, PARADE-Transformer), served in the gateway.

PARADE (Li et al., 2020) folds the pooled [CLS] vectors of a document's
windows into one document score with a small learned model: attention weights
over the windows (Attn) or two transformer layers over them (Transformer).
``keyrank finetune --strategy parade-attn|parade-transformer`` trains one and
exports it to ONNX (``models/gateway/parade-attn.onnx``); here it runs in the
gateway with ONNX Runtime.

Why in the gateway and not as a second Triton model: the aggregator is tiny
(~0.6M parameters for Transformer, ~400 for Attn over hidden 384) and reads
only the pooled vectors the cross-encoder already returned, so a CPU call costs
microseconds, while a Triton round trip (serialise [D, W, H], gRPC, queue)
costs a millisecond or more and another failure mode. No torch is imported here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

KINDS = ("parade-attn", "parade-transformer", "keyb2-blocks-attn")
"""The aggregators ``keyrank finetune`` trains; each file is named ``<kind>.onnx`` (``keyb2-blocks-attn``: PARADE-Attn
over keyb2-blocks' inputs)."""
INPUTS = ("pooled", "mask")
"""ONNX inputs: float32 [D, W, H] windows' pooled vectors (zero-padded), float32 [D, W] 1 = a real window."""
OUTPUT = "scores"
"""ONNX output: float32 [D] one score per document."""


def pad_by_document(doc_of: np.ndarray, pooled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[S, H] vectors grouped by document -> [D, W, H] zero-padded and the [D, W] window mask.

    ``doc_of`` is non-decreasing and names every document 0..D-1 (the pipeline's order)."""
    doc_of = np.asarray(doc_of, dtype=np.int64)
    pooled = np.asarray(pooled, dtype=np.float32)
    if doc_of.shape[0] != pooled.shape[0]:
        raise ValueError(f"{doc_of.shape[0]} document indices for {pooled.shape[0]} pooled vectors")
    if doc_of.size and np.any(np.diff(doc_of) < 0):
        raise ValueError("sequences must be grouped by document")
    n_docs = int(doc_of[-1]) + 1 if doc_of.size else 0
    counts = np.bincount(doc_of, minlength=n_docs)
    firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    slot = np.arange(doc_of.shape[0]) - firsts[doc_of]
    width = max(1, int(counts.max()) if counts.size else 1)
    padded = np.zeros((n_docs, width, pooled.shape[1]), dtype=np.float32)
    mask = np.zeros((n_docs, width), dtype=np.float32)
    padded[doc_of, slot] = pooled
    mask[doc_of, slot] = 1.0
    return padded, mask


class TrainedAggregator:
    """A trained PARADE aggregator: ``aggregator(doc_of, pooled) -> scores`` (float64 [D])."""

    def __init__(self, session, meta: dict):
        self.session = session
        """The ONNX Runtime session of the exported aggregator."""
        self.meta = meta
        """What the export recorded: kind, hidden size, the encoder it was trained on, training summary."""

    @classmethod
    def load(cls, path: str | Path, *, threads: int = 1) -> TrainedAggregator:
        """Open ``<kind>.onnx``; one intra-op thread is plenty for [D, W, H] of a request."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        meta = {k: _maybe_json(v) for k, v in session.get_modelmeta().custom_metadata_map.items()}
        return cls(session, meta)

    @property
    def hidden_size(self) -> int:
        """Width of the pooled vectors it reads."""
        return int(self.session.get_inputs()[0].shape[2])

    def __call__(self, doc_of: np.ndarray, pooled: np.ndarray) -> np.ndarray:
        padded, mask = pad_by_document(doc_of, pooled)
        if padded.shape[2] != self.hidden_size:
            raise ValueError(f"pooled vectors of width {padded.shape[2]}; this aggregator reads {self.hidden_size}")
        (scores,) = self.session.run([OUTPUT], {"pooled": padded, "mask": mask})
        return np.asarray(scores, dtype=np.float64).reshape(-1)


def _maybe_json(value: str):
    try:
        return json.loads(value)
    except ValueError:
        return value
