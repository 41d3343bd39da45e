"""The gateway heads of CEDR-KNRM, -DRMM, -PACRR and Neural Model 1 as torch modules, their export, their graphs.

A head reads the chunks' feature vectors of each document, zero-padded to
[D, W, F] with a [D, W] chunk mask (``aggregators.pad_by_document``, as PARADE's
aggregators do), folds them (sums add; pooled vectors averaged) and answers one
score per document (keyrank/interaction.py has the layout):

- ``KnrmHead``: log of each folded kernel sum (floored), x 0.01, summed over the
  query tokens; one linear layer over kernels x layers plus one over the mean pooled
  vector. The pooled layer starts as the cross-encoder's classifier and the kernel
  layer at zero, so before training it IS parade-avg over disjoint chunks.
- ``DrmmHead``: log-counts of the folded histograms, a feed-forward score per query
  token (zero at start), summed over the query tokens, plus the pooled layer as above.
- ``PacrrHead``: the k largest of the chunks' k-max values per query token and
  n-gram size, PACRR's dense layers (last one zero at start) plus the pooled layer.
- ``Model1Head``: sum over query tokens of log((folded sum of T(q|d) + floor) / |D|),
  the IBM Model 1 log-likelihood; its translation network lives in the graph.

``keyrank finetune --strategy cedr-knrm|cedr-drmm`` trains them on cached chunk
features (frozen encoder, like PARADE); ``cedr-pacrr|model1``, whose graphs hold
learned weights, run the graph in every step (``GraphEncoder``, encoder frozen).
Each run writes ``<kind>.onnx`` and the graph ``<kind>-features.onnx`` it was
trained on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn

from keyrank.interaction import DRMM_FLOOR, KINDS, KNRM_SCALE, LOG_FLOOR, MASKED, PACRR_K, PACRR_NGRAMS, FeatureLayout


def fold(features: torch.Tensor, mask: torch.Tensor, layout: FeatureLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[D, W, F], [D, W] -> (mean pooled [D, H], query mask [D, Q], folded chunk sums [D, sums])."""
    summed = (features * mask.unsqueeze(-1)).sum(1)
    chunks = mask.sum(1, keepdim=True).clamp(min=1.0)
    h, q = layout.hidden, layout.slots
    return summed[:, :h] / chunks, (summed[:, h:h + q] > 0).to(features.dtype), summed[:, h + q:]


class KnrmHead(nn.Module):
    """CEDR-KNRM's head over folded kernel sums and the mean [CLS] vector."""

    def __init__(self, layout: FeatureLayout):
        super().__init__()
        self.layout = layout
        self.kernels = nn.Linear(layout.layers * layout.bins, 1, bias=False)
        self.head = nn.Linear(layout.hidden, 1)
        nn.init.zeros_(self.kernels.weight)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pooled, query, sums = fold(features, mask, self.layout)
        sums = sums.reshape(sums.shape[0], self.layout.slots, -1)
        logs = (torch.log(sums.clamp(min=LOG_FLOOR)) * KNRM_SCALE * query.unsqueeze(-1)).sum(1)
        return (self.kernels(logs) + self.head(pooled)).squeeze(-1)


class DrmmHead(nn.Module):
    """CEDR-DRMM's head: a feed-forward score per query token over its log-count histograms (bins x layers), summed
    over the query tokens, plus a linear layer over the mean [CLS] vector (CEDR's 5 hidden units)."""

    def __init__(self, layout: FeatureLayout, hidden: int = 5):
        super().__init__()
        self.layout = layout
        self.hidden = nn.Linear(layout.layers * layout.bins, hidden)
        self.out = nn.Linear(hidden, 1)
        self.head = nn.Linear(layout.hidden, 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pooled, query, counts = fold(features, mask, self.layout)
        histograms = torch.log(counts.reshape(counts.shape[0], self.layout.slots, -1) + DRMM_FLOOR)
        per_token = self.out(torch.relu(self.hidden(histograms))).squeeze(-1)  # [D, Q]
        return (per_token * query).sum(1) + self.head(pooled).squeeze(-1)


class PacrrHead(nn.Module):
    """CEDR-PACRR's head: the k largest of the chunks' k-max values per query token and n-gram size (masked chunks
    and missing values read as 0), through PACRR's dense layers (32, 32, 1), plus a linear layer over the mean
    [CLS] vector; the last dense layer starts at zero (parade-avg over the chunks)."""

    def __init__(self, layout: FeatureLayout, hidden: int = 32):
        super().__init__()
        self.layout = layout
        self.dense = nn.Sequential(nn.Linear(layout.sums, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                   nn.Linear(hidden, 1))
        self.head = nn.Linear(layout.hidden, 1)
        nn.init.zeros_(self.dense[-1].weight)
        nn.init.zeros_(self.dense[-1].bias)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h, q = self.layout.hidden, self.layout.slots
        pooled = (features[..., :h] * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
        query = ((features[..., h:h + q] * mask.unsqueeze(-1)).sum(1) > 0).to(features.dtype)
        d, w = mask.shape
        values = features[..., h + q:].reshape(d, w, q, PACRR_NGRAMS, PACRR_K)
        values = torch.where(mask[:, :, None, None, None] > 0, values, torch.full_like(values, MASKED))
        values = values.permute(0, 2, 3, 1, 4).reshape(d, q, PACRR_NGRAMS, w * PACRR_K)
        kmax = values.topk(PACRR_K, dim=-1).values  # k-max of the chunks' k-maxes
        kmax = torch.where(kmax > MASKED / 2, kmax, torch.zeros_like(kmax)) * query[:, :, None, None]
        return (self.dense(kmax.reshape(d, -1)) + self.head(pooled)).squeeze(-1)


class Model1Head(nn.Module):
    """Neural Model 1's log-likelihood of the query given the document's folded translation sums."""

    def __init__(self, layout: FeatureLayout):
        super().__init__()
        self.layout = layout

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        _, query, sums = fold(features, mask, self.layout)
        t, count = sums[:, : self.layout.slots], sums[:, self.layout.slots:].clamp(min=1.0)
        return (torch.log((t + LOG_FLOOR) / count) * query).sum(1)


def build(layout: FeatureLayout, head_weight: np.ndarray | None = None, head_bias: np.ndarray | None = None) -> nn.Module:
    """A fresh head; KNRM's pooled layer starts as the cross-encoder's classifier (the relevance label's row)."""
    if layout.kind not in KINDS:
        raise ValueError(f"unknown interaction head {layout.kind!r}; expected one of {KINDS}")
    module = {"cedr-knrm": KnrmHead, "cedr-drmm": DrmmHead, "cedr-pacrr": PacrrHead, "model1": Model1Head}[layout.kind](layout)
    if head_weight is not None and hasattr(module, "head"):
        with torch.no_grad():
            module.head.weight.copy_(torch.as_tensor(np.asarray(head_weight, np.float32)[-1:]))
            module.head.bias.copy_(torch.as_tensor(np.asarray(head_bias, np.float32)[-1:]))
    return module


def sample_features(layout: FeatureLayout, rows: int, seed: int = 0) -> np.ndarray:
    """Feature vectors shaped like a graph's: positive sums, a query of a few slots."""
    rng = np.random.default_rng(seed)
    features = rng.random((rows, layout.width)).astype(np.float32) * 5.0
    features[:, : layout.hidden] = rng.standard_normal((rows, layout.hidden))
    features[:, layout.hidden: layout.hidden + layout.slots] = 0.0
    features[:, layout.hidden: layout.hidden + 5] = 1.0
    return features


def export(module: nn.Module, path: Path, meta: dict | None = None, *, atol: float = 1e-4, graph: Path | None = None) -> float:
    """Write the head as ONNX (dynamic documents and chunks), check it against PyTorch, return max |diff|;
    ``graph``: the interaction graph it reads, copied beside it (what ``--install-into`` installs with it)."""
    from keyrank.training.parade import export_checked

    layout: FeatureLayout = module.layout
    diff = export_checked(module, path, sample_features(layout, 11), {"kind": layout.kind, "layout": layout.to_json(), **(meta or {})},
                          atol=atol, label=layout.kind)
    if graph is not None:
        shutil.copyfile(graph, Path(path).parent / Path(graph).name)
    return diff


class GraphEncoder(nn.Module):
    """A graph with learned weights under training (Model 1's T(q|d), CEDR-PACRR's n-gram filters):
    ``forward(batch) -> (relevance [N], chunk features [N, F])``, the cross-encoder in it frozen (and kept in
    eval mode), the rest learning."""

    def __init__(self, checkpoint: str, kind: str):
        super().__init__()
        from keyrank.prepare import interaction as graph

        self.graph = graph.build(checkpoint, kind)
        for p in self.graph.model.parameters():
            p.requires_grad_(False)

    @property
    def hf(self) -> nn.Module:
        """What the resumable state saves and restores (the whole graph: encoder and translation network)."""
        return self.graph

    def train(self, mode: bool = True) -> GraphEncoder:
        super().train(mode)
        self.graph.model.eval()  # frozen: no dropout in the features it computes
        return self

    def forward(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits, features = self.graph(batch.input_ids, batch.attention_mask, batch.token_type_ids, batch.token_roles)
        return logits.reshape(logits.shape[0], -1)[:, -1], features


def graph_of(encoder: nn.Module | None, model_dir: Path, folder: Path, meta: dict) -> Path | None:
    """The trained graph of a ``GraphEncoder`` exported (checked on ``model_dir``'s pipeline) into ``folder``;
    None for a run whose graph did not train (the CEDR heads read the base encoder's graph)."""
    if not isinstance(encoder, GraphEncoder):
        return None
    from keyrank.prepare import interaction as graph

    return Path(graph.export(encoder.graph, Path(model_dir), meta, folder=Path(folder))["path"])


def graph_layout(path: Path) -> FeatureLayout | None:
    """The layout an interaction graph recorded, or None when there is no graph at ``path``."""
    if not Path(path).exists():
        return None
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    return FeatureLayout.from_json(json.loads(meta["layout"]))


def prepare_graph(checkpoint: str, model_dir: Path, kind: str, fingerprint: str) -> FeatureLayout:
    """The strategy's interaction graph in the prepared ``model_dir``'s gateway/ (exported from ``checkpoint``
    when it is not there yet): what the chunk features are cached with and what the head is built for."""
    from keyrank.interaction import features_file
    from keyrank.prepare import interaction as graph

    layout = graph_layout(Path(model_dir) / "gateway" / features_file(kind))
    if layout is None:
        module = graph.build(checkpoint, kind)
        graph.export(module, Path(model_dir), {"encoder_fingerprint": fingerprint, "encoder": str(checkpoint)})
        layout = module.layout
    return layout
