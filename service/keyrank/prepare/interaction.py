"""The interaction graphs of CEDR-KNRM, -DRMM, -PACRR and Neural Model 1: the encoder and each chunk's features.

``ChunkFeatures`` wraps the Hugging Face cross-encoder and answers, per chunk,
``logits`` (the cross-encoder's own) and ``pooled`` = the chunk's feature vector
(keyrank/interaction.py: [pooled | query slots | chunk sums]). It reads a fourth
input, ``token_roles`` [N, L] (the gateway's ``InputTemplate.roles``: 1 query, 2
document, 0 frame and padding), and finds the query positions in the graph: a
one-hot [N, Q, L] selection from the running count of query tokens. The
per-token hidden states of every layer stay inside the graph.

``export`` writes ``<kind>-features.onnx`` and checks it against PyTorch on the
serving pipeline's own inputs (chunks of a long document, padding included).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from keyrank.interaction import (
    HISTOGRAM_BINS,
    KERNEL_MUS,
    KERNEL_SIGMAS,
    MASKED,
    PACRR_FILTERS,
    PACRR_K,
    PACRR_NGRAMS,
    FeatureLayout,
    features_file,
)
from keyrank.modelserver.repository import GRAPH_INPUTS
from keyrank.template import ROLE_DOCUMENT, ROLE_QUERY

INPUTS = GRAPH_INPUTS
"""The interaction graph's inputs, as the model server expects them: the cross-encoder's three, then the roles."""


class Translation(nn.Module):
    """Neural Model 1's T(q|d) in (0, 1): a sigmoid of the scaled cosine of the projected last-layer
    embeddings of a query token and a document token (Boytsov and Kolter, 2021, a small network)."""

    def __init__(self, hidden: int, width: int = 128):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.project = nn.Linear(hidden, width)
        self.scale = nn.Parameter(torch.tensor(8.0))
        self.bias = nn.Parameter(torch.tensor(-4.0))

    def forward(self, query: torch.Tensor, document: torch.Tensor) -> torch.Tensor:
        """[N, Q, H], [N, L, H] -> [N, Q, L]."""
        q = nn.functional.normalize(self.project(self.norm(query)), dim=-1)
        d = nn.functional.normalize(self.project(self.norm(document)), dim=-1)
        return torch.sigmoid(self.scale * (q @ d.transpose(-1, -2)) + self.bias)


class NgramFilters(nn.Module):
    """CEDR-PACRR's learned part in the graph: per n = 1..3, ``PACRR_FILTERS`` n x n convolutions over the layers'
    [Q, L] similarity matrices (zero-padded at the ends, as PACRR pads), max over the filters, then the k largest
    values over the chunk's document positions per query token."""

    def __init__(self, layers: int):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(layers, PACRR_FILTERS, (n, n)) for n in range(1, PACRR_NGRAMS + 1))

    def forward(self, similarity: torch.Tensor, is_document: torch.Tensor) -> torch.Tensor:
        """[layers, N, Q, L] -> [N, Q, ngrams, k]."""
        x = (similarity * is_document[None, :, None, :]).permute(1, 0, 2, 3)  # frame and padding read as 0
        values = []
        for n, conv in enumerate(self.convs, start=1):
            y = conv(nn.functional.pad(x, (0, n - 1, 0, n - 1))).max(dim=1).values  # [N, Q, L]
            y = torch.where(is_document.unsqueeze(1) > 0, y, torch.full_like(y, MASKED))  # windows start on the document
            values.append(y.topk(PACRR_K, dim=-1).values)
        return torch.stack(values, dim=2)


def query_selection(token_roles: torch.Tensor, slots: int) -> torch.Tensor:
    """float [N, Q, L]: row q is one-hot on the q-th query token (all zero past the query's length)."""
    is_query = (token_roles == ROLE_QUERY).float()
    slot = torch.cumsum(is_query, dim=1) - 1.0
    wanted = torch.arange(slots, device=token_roles.device, dtype=slot.dtype).view(1, slots, 1)
    return (slot.unsqueeze(1) == wanted).float() * is_query.unsqueeze(1)


def similarities(states: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """[layers, N, L, H] hidden states -> [layers, N, Q, L] cosine similarity of each query slot with each token."""
    unit = states / states.norm(dim=-1, keepdim=True).clamp(min=1e-9)
    return (select.unsqueeze(0) @ unit) @ unit.transpose(-1, -2)


def drmm_counts(similarity: torch.Tensor, is_document: torch.Tensor) -> torch.Tensor:
    """[layers, N, Q, L] -> [N, Q, layers, bins]: per query slot and layer, the chunk's document tokens in each
    similarity bin (CEDR's hard histogram: bin = int((s + 1.000001) / 2 x (bins - 1)))."""
    index = torch.floor((similarity + 1.000001) / 2.0 * (HISTOGRAM_BINS - 1))
    bins = torch.arange(HISTOGRAM_BINS, dtype=similarity.dtype, device=similarity.device)
    counts = ((index.unsqueeze(-1) == bins).to(similarity.dtype) * is_document[None, :, None, :, None]).sum(3)
    return counts.permute(1, 2, 0, 3)


def knrm_sums(similarity: torch.Tensor, is_document: torch.Tensor) -> torch.Tensor:
    """[layers, N, Q, L] -> [N, Q, layers, kernels]: per query slot, layer and RBF kernel, the sum over document
    tokens of the kernel of the cosine similarity (CEDR-KNRM's chunk-additive part)."""
    mus = torch.tensor(KERNEL_MUS, dtype=similarity.dtype, device=similarity.device)
    sigmas = torch.tensor(KERNEL_SIGMAS, dtype=similarity.dtype, device=similarity.device)
    kernels = torch.exp(-((similarity.unsqueeze(-1) - mus) ** 2) / (2 * sigmas**2))  # [layers, N, Q, L, K]
    sums = (kernels * is_document[None, :, None, :, None]).sum(3)
    return sums.permute(1, 2, 0, 3)


class ChunkFeatures(nn.Module):
    """(logits, chunk features) of a sequence-classification cross-encoder, for ``layout.kind``."""

    def __init__(self, model: nn.Module, head: nn.Module, layout: FeatureLayout, translation: Translation | None = None,
                 filters: NgramFilters | None = None):
        super().__init__()
        from keyrank.prepare.cross_encoder import wrapper_classes

        self.model = model
        self.layout = layout
        self.translation = translation
        self.filters = filters
        if (layout.kind == "model1") != (translation is not None) or (layout.kind == "cedr-pacrr") != (filters is not None):
            raise ValueError(f"{layout.kind}'s graph: Model 1 has a translation network, CEDR-PACRR n-gram filters, no other")
        self._call = wrapper_classes()[0].call
        self._seen: list[torch.Tensor] = []
        head.register_forward_hook(lambda _m, inputs, _out: self._seen.append(inputs[0]))
        model.config.output_hidden_states = True

    def forward(self, input_ids, attention_mask, token_type_ids, token_roles):
        self._seen.clear()
        out = self._call(self.model, input_ids, attention_mask, token_type_ids)
        pooled = self._seen[-1]
        n = input_ids.shape[0]
        select = query_selection(token_roles, self.layout.slots)
        is_document = (token_roles == ROLE_DOCUMENT).float()
        if self.layout.kind.startswith("cedr-"):
            similarity = similarities(torch.stack(out.hidden_states[-self.layout.layers:]), select)
            reduce = {"cedr-knrm": knrm_sums, "cedr-drmm": drmm_counts, "cedr-pacrr": self.filters}[self.layout.kind]
            sums = reduce(similarity, is_document).reshape(n, -1)
        else:
            last = out.hidden_states[-1]
            t = self.translation(select @ last, last) * is_document.unsqueeze(1)
            sums = torch.cat([t.sum(-1), is_document.sum(-1, keepdim=True)], dim=1)
        return out.logits, torch.cat([pooled, select.sum(-1), sums], dim=1)


def build(checkpoint: str | Path, kind: str, translation: Translation | None = None) -> ChunkFeatures:
    """The graph's module for a checkpoint (encoders only: a decoder reranker has no [CLS] to average)."""
    from keyrank.prepare.cross_encoder import final_linear, load_checkpoint
    from transformers import AutoModelForSequenceClassification

    model = load_checkpoint(AutoModelForSequenceClassification, Path(checkpoint))
    probe = (torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    _, head = final_linear(model, probe)
    layers = int(model.config.num_hidden_layers) + 1
    layout = FeatureLayout(kind, int(head.in_features), layers)
    if kind == "model1" and translation is None:
        translation = Translation(layout.hidden)
    filters = NgramFilters(layers) if kind == "cedr-pacrr" else None
    return ChunkFeatures(model, head, layout, translation, filters).eval()


def check_batch(model_dir: Path):
    """A padded batch the serving pipeline plans (disjoint chunks of a long and a short document), as tensors."""
    from keyrank.config import get_settings
    from keyrank.pipeline import Pipeline, RerankOptions
    from keyrank.scoring import bucket_batches

    settings = get_settings().with_overrides(model_dir=Path(model_dir))
    pipeline = Pipeline.from_model_dir(settings)
    long_doc = " ".join(["Cats purr by vibrating the muscles of the larynx while breathing in and out."] * 60)
    plan = pipeline.plan("how do cats purr", [long_doc, "a cat is an animal"], RerankOptions(strategy="avgp"))
    (batch,) = bucket_batches(plan.inputs, buckets=(max(len(i) for i in plan.inputs.ids),), batch_size=64,
                              pad_id=pipeline.template.pad_id)
    return tuple(torch.from_numpy(batch.feeds(roles=True)[name]) for name in INPUTS)


def export(module: ChunkFeatures, model_dir: Path, meta: dict | None = None, *, atol: float = 1e-3,
           folder: Path | None = None) -> dict:
    """Write ``<kind>-features.onnx`` into ``folder`` (default: ``model_dir/gateway/``), checked against PyTorch
    on ``model_dir``'s serving pipeline; what was checked."""
    import onnx
    import onnxruntime as ort

    batch = check_batch(model_dir)
    path = Path(folder or Path(model_dir) / "gateway") / features_file(module.layout.kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".onnx.tmp")
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUTS} | {"logits": {0: "batch"}, "pooled": {0: "batch"}}
    module = module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # shape warnings: the check on another shape below settles them
        reference = module(*batch)[1].numpy()
        dummy = tuple(t[-2:, : max(8, int((batch[1][-2:].sum(1)).max()))] for t in batch)
        torch.onnx.export(module, dummy, str(tmp), input_names=list(INPUTS), output_names=["logits", "pooled"],
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    graph = onnx.load(str(tmp))
    for key, value in {"layout": module.layout.to_json(), **(meta or {})}.items():
        graph.metadata_props.add(key=key, value=value if isinstance(value, str) else json.dumps(value))
    onnx.save(graph, str(tmp))
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    (served,) = session.run(["pooled"], {name: t.numpy() for name, t in zip(INPUTS, batch)})
    # Relative to the value: a kernel sum adds hundreds of terms, and the exact-match kernel (sigma 0.001)
    # turns a float32 rounding of a similarity into ~1e-4 of kernel. A histogram count moves by one when a
    # similarity on a bin edge rounds the other way: a few such moves are allowed, no other difference.
    gap = np.abs(reference - served)
    if module.layout.kind == "cedr-drmm":
        counts = slice(module.layout.hidden + module.layout.slots, None)
        moved = float(np.mean(gap[:, counts] > 0))
        if moved > atol or gap[:, counts].max() > 1.0:
            tmp.unlink()
            raise ValueError(f"cedr-drmm histograms: ONNX moved {moved:.2%} of the counts from PyTorch's, by up to {gap[:, counts].max():g}")
        gap[:, counts] = 0.0
    diff = float(np.max(gap / (1.0 + np.abs(reference))))
    if not diff <= atol:
        tmp.unlink()
        raise ValueError(f"{module.layout.kind} chunk features: ONNX differs from PyTorch by {diff:.3g} (relative) > {atol:g}")
    tmp.replace(path)
    return {"path": str(path), "layout": module.layout.to_json(), "max_abs_diff": diff, "rows": int(batch[0].shape[0])}


def write_triton_models(model_dir: Path, graph_path: Path) -> list[Path]:
    """The graph as a model of both Triton repositories of the prepared ``model_dir`` (``<kind>-features``: the
    Python-backend model of ``triton-embedded/`` over the same ONNX Runtime file, and the native onnxruntime one of
    ``triton/``), so a gateway scoring on Triton sends the strategy's chunks there; the model folders written."""
    import shutil

    from keyrank.config import get_settings
    from keyrank.modelserver.repository import GRAPH_SUFFIX, PYTHON_MODELS
    from keyrank.prepare.repositories import triton_config, write_if_changed

    model_dir, graph_path = Path(model_dir), Path(graph_path)
    ce = json.loads((model_dir / "gateway" / "manifest.json").read_text())["cross_encoder"]
    name = graph_path.stem
    if not name.endswith(GRAPH_SUFFIX):
        raise ValueError(f"{graph_path.name}: an interaction graph's file is named <kind>{GRAPH_SUFFIX}.onnx")
    shape = {"hidden_size": _width(graph_path), "num_labels": ce["num_labels"], "max_batch_size": 64,
             "max_length": get_settings().longest_input(ce["max_length"]), "name": name, "inputs": INPUTS}
    written = []
    for repository, backend in (("triton", "onnxruntime"), ("triton-embedded", "python")):
        folder = model_dir / repository / name
        write_if_changed(folder / "config.pbtxt", triton_config(backend=backend, **shape))
        (folder / "1").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(graph_path, folder / "1" / "model.onnx")
        if backend == "python":
            for file in ("model.py", "grouping.py"):
                write_if_changed(folder / "1" / file, (PYTHON_MODELS / file).read_text())
            write_if_changed(folder / "1" / "runtime.json", json.dumps({"runtime": "onnxruntime"}) + "\n")
        written.append(folder)
    return written


def _width(graph_path: Path) -> int:
    """The feature width, from the layout the graph recorded."""
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(graph_path), load_external_data=False).metadata_props}
    return FeatureLayout.from_json(json.loads(meta["layout"])).width
