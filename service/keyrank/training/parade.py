"""PARADE's learned aggregators as torch modules, and their ONNX export.

Both read the windows' pooled vectors of each document, zero-padded to
[D, W, H] with a [D, W] mask (``keyrank.aggregators.pad_by_document``), and
answer one score per document:

- ``ParadeAttn``: softmax attention weights over the windows, the weighted mean
  through a linear head. The attention layer starts at zero (uniform weights)
  and the head at the cross-encoder's own classifier, so before training it IS
  parade-avg; training moves it away from the mean only where that helps.
- ``ParadeTransformer``: a learned [CLS] vector prepended to the windows, two
  transformer layers (the paper's setting), the [CLS] output through the head.
  Pre-LN layers whose output projections start at zero, so each layer starts
  as the identity and training is stable from the first step. No position
  embeddings: the aggregator cannot learn a preference for early windows.

The layers are written out (no ``nn.TransformerEncoder``) so that the export
is plain MatMul/Softmax ops that any ONNX Runtime runs, masks included.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from keyrank.aggregators import INPUTS, KINDS, OUTPUT

_MASKED = 1e4
"""Added (negated) to the attention logits of padding windows: finite, so no NaN in ONNX."""


class ParadeAttn(nn.Module):
    """PARADE-Attn: document = softmax(w . p_i) weighted mean of the pooled vectors p_i."""

    def __init__(self, hidden: int):
        super().__init__()
        self.attention = nn.Linear(hidden, 1)
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.attention.weight)
        nn.init.zeros_(self.attention.bias)

    def forward(self, pooled: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = self.attention(pooled).squeeze(-1) + (mask - 1.0) * _MASKED
        weights = torch.softmax(logits, dim=-1) * mask
        weights = weights / weights.sum(-1, keepdim=True).clamp(min=1e-9)
        document = (weights.unsqueeze(-1) * pooled).sum(1)
        return self.head(document).squeeze(-1)


class _Layer(nn.Module):
    """A pre-LN transformer encoder layer with an additive key mask."""

    def __init__(self, hidden: int, heads: int, ffn: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.scale = 1.0 / math.sqrt(hidden // heads)
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.ffn_in = nn.Linear(hidden, ffn)
        self.ffn_out = nn.Linear(ffn, hidden)
        self.dropout = nn.Dropout(dropout)
        for zero in (self.out, self.ffn_out):  # identity at start
            nn.init.zeros_(zero.weight)
            nn.init.zeros_(zero.bias)

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        d, w, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(d, w, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        scores = (q @ k.transpose(-1, -2)) * self.scale + key_bias[:, None, None, :]
        attended = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(d, w, h)
        x = x + self.dropout(self.out(attended))
        return x + self.dropout(self.ffn_out(torch.nn.functional.gelu(self.ffn_in(self.norm2(x)))))


class ParadeTransformer(nn.Module):
    """PARADE-Transformer: [CLS] + windows through two layers; the [CLS] output through the head."""

    def __init__(self, hidden: int, layers: int = 2, heads: int | None = None, dropout: float = 0.1):
        super().__init__()
        heads = heads or next(n for n in (12, 8, 6, 4, 2, 1) if hidden % n == 0)
        self.cls = nn.Parameter(torch.randn(hidden) * 0.02)
        self.layers = nn.ModuleList(_Layer(hidden, heads, 4 * hidden, dropout) for _ in range(layers))
        self.head = nn.Linear(hidden, 1)

    def forward(self, pooled: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        d = pooled.shape[0]
        x = torch.cat([self.cls.expand(d, 1, -1), pooled], dim=1)
        key_bias = (torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1) - 1.0) * _MASKED
        for layer in self.layers:
            x = layer(x, key_bias)
        return self.head(x[:, 0]).squeeze(-1)


def build(kind: str, hidden: int, head_weight: np.ndarray | None = None, head_bias: np.ndarray | None = None) -> nn.Module:
    """A fresh aggregator; its head starts as the cross-encoder's classifier head (the relevance label's row)."""
    if kind not in KINDS:
        raise ValueError(f"unknown aggregator {kind!r}; expected one of {KINDS}")
    module = ParadeAttn(hidden) if kind.endswith("-attn") else ParadeTransformer(hidden)
    if head_weight is not None:
        with torch.no_grad():
            module.head.weight.copy_(torch.as_tensor(np.asarray(head_weight, np.float32)[-1:]))
            module.head.bias.copy_(torch.as_tensor(np.asarray(head_bias, np.float32)[-1:]))
    return module


def export(module: nn.Module, kind: str, path: Path, meta: dict | None = None, *, atol: float = 1e-4) -> float:
    """Write ``module`` as ONNX (dynamic documents and windows), check it against PyTorch, return max |diff|."""
    rng = np.random.default_rng(0)
    rows = np.repeat(np.arange(4), [1, 3, 5, 2]).shape[0]
    pooled = rng.standard_normal((rows, module.head.in_features)).astype(np.float32)
    return export_checked(module, path, pooled, {"kind": kind, **(meta or {})}, atol=atol, label=kind)


def export_checked(module: nn.Module, path: Path, vectors: np.ndarray, metadata: dict, *, atol: float, label: str) -> float:
    """Write a gateway aggregator (inputs ``pooled`` [D, W, F] and ``mask`` [D, W], output [D]; dynamic D and W) as
    ONNX with ``metadata``, check it on ``vectors`` (11 rows: documents of 1, 3, 5 and 2 windows in one padded
    batch, so a mask bug shows) against PyTorch, and return max |diff|; the file appears only if it passes."""
    import onnx

    from keyrank.aggregators import TrainedAggregator, pad_by_document

    module = module.eval()
    doc_of = np.repeat(np.arange(4), [1, 3, 5, 2])
    padded, mask = pad_by_document(doc_of, vectors)
    dummy = pad_by_document(np.repeat(np.arange(2), [2, 1]), vectors[:3])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".onnx.tmp")
    with torch.no_grad(), warnings.catch_warnings():
        # Tracer warnings about shapes are what the check on another shape (below) settles.
        warnings.simplefilter("ignore")
        reference = module(torch.from_numpy(padded), torch.from_numpy(mask)).numpy()
        torch.onnx.export(
            module, tuple(torch.from_numpy(a) for a in dummy), str(tmp), input_names=list(INPUTS), output_names=[OUTPUT],
            dynamic_axes={"pooled": {0: "documents", 1: "windows"}, "mask": {0: "documents", 1: "windows"}, OUTPUT: {0: "documents"}},
            opset_version=17, dynamo=False,
        )
    graph = onnx.load(str(tmp))
    for key, value in metadata.items():
        graph.metadata_props.add(key=key, value=value if isinstance(value, str) else json.dumps(value))
    onnx.save(graph, str(tmp))
    served = TrainedAggregator.load(tmp)(doc_of, vectors)
    diff = float(np.max(np.abs(served - reference)))
    if not diff <= atol:
        tmp.unlink()
        raise ValueError(f"{label}: ONNX differs from PyTorch by {diff:.3g} > {atol:g}")
    tmp.replace(path)
    return diff
