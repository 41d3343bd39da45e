"""CEDR-KNRM, CEDR-DRMM, CEDR-PACRR and Neural Model 1, split between the model server and the gateway.

All read the encoder's token embeddings, which never leave the model: an
interaction graph (``<kind>-features.onnx``, exported by ``keyrank finetune``
with the encoder inside, prepare/interaction.py) scores each chunk and answers,
in place of the cross-encoder's pooled vector, one small feature vector per
chunk whose parts add up over a document's chunks (PACRR's: whose k-maxes fold by k-max):

    [ pooled (H) | query slots (Q) | chunk sums ]

- pooled: the cross-encoder's pooled [CLS] vector (averaged over the chunks, as CEDR does);
- query slots: 1 for each of the first ``Q`` query tokens present (the gateway's ``token_roles``
  input says which positions are query and which are document tokens);
- chunk sums, ``cedr-knrm`` (MacAvaney et al., 2019): per query slot, per layer (embeddings
  included), per RBF kernel, the sum over the chunk's document tokens of the kernel of the cosine
  similarity, [Q, layers, kernels];
- chunk sums, ``cedr-drmm``: per query slot, per layer, per similarity bin, how many of the chunk's
  document tokens fall in the bin (counts add), [Q, layers, bins];
- chunk values, ``cedr-pacrr``: per query slot and n-gram size, the k largest values over the chunk's
  document positions of the n x n convolutions of the layers' similarity matrices, [Q, ngrams, k]
  (not sums: the gateway keeps the k largest of the chunks' k largest, which is exact for every
  window inside a chunk; the n - 1 windows that would straddle each chunk boundary are not read);
- chunk sums, ``model1`` (Boytsov and Kolter, 2021): per query slot, the sum over the chunk's
  document tokens of the learned translation probability T(q|d) over the last layer's embeddings,
  then the chunk's document-token count, [Q + 1].

The gateway's head (``<kind>.onnx``, served like PARADE's trained aggregators by
``aggregators.TrainedAggregator``) folds the chunks (sums add; the pooled vectors are averaged)
and scores the document: KNRM takes log of each folded kernel sum, sums over the query tokens and
puts kernels x layers with the mean pooled vector through one linear layer; PACRR keeps the k largest of
the chunks' k-max values and puts them through its dense layers; DRMM takes log-counts of
the folded histograms, scores each query token with a small feed-forward network over bins x layers
and adds the query tokens' scores to a linear layer over the mean pooled vector; Model 1 answers the
log-likelihood sum_q log(sum_d T(q|d) / |D|). So a document read in chunks scores exactly as the
same model reading the concatenation of its chunks' similarity matrices (tests/test_interaction.py).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("cedr-knrm", "cedr-drmm", "cedr-pacrr", "model1")
"""The interaction heads; each is served from ``<kind>.onnx`` and ``<kind>-features.onnx``."""
LEARNED_GRAPHS = ("cedr-pacrr", "model1")
"""Kinds whose graph holds learned weights (PACRR's n-gram filters, Model 1's T(q|d)): training runs the graph."""
PACRR_NGRAMS = 3
"""PACRR's n x n convolutions, n = 1..3 (CEDR's setting), 32 filters each, max over the filters."""
PACRR_FILTERS = 32
PACRR_K = 2
"""k of PACRR's k-max pooling over document positions, per query token and n-gram size (CEDR's setting)."""
MASKED = -1e4
"""A k-max value where there was nothing to take (fewer document positions than k): never kept, read as 0."""
KERNEL_MUS = (-0.9, -0.7, -0.5, -0.3, -0.1, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
"""KNRM's RBF kernel centres (Xiong et al., 2017; CEDR's setting): 10 soft-match bins and exact match."""
KERNEL_SIGMAS = (0.1,) * 10 + (0.001,)
"""KNRM's kernel widths: 0.1, and 0.001 for the exact-match kernel at 1.0."""
HISTOGRAM_BINS = 11
"""DRMM's similarity histogram bins over [-1, 1] (CEDR's setting; the last one is exact match)."""
QUERY_SLOTS = 32
"""Query tokens an interaction graph reads (the default ``query_max_tokens``); later ones are not read."""
DRMM_FLOOR = 1e-5
"""log(count + floor): CEDR's log-count histograms."""
LOG_FLOOR = 1e-10
"""log(max(sum, floor)): CEDR's clamp of an empty kernel."""
KNRM_SCALE = 0.01
"""CEDR scales the log kernel sums by 0.01 before the linear layer."""


def features_file(kind: str) -> str:
    """The interaction graph's file under models/gateway/."""
    return f"{kind}-features.onnx"


def head_file(kind: str) -> str:
    """The gateway head's file under models/gateway/."""
    return f"{kind}.onnx"


@dataclass(frozen=True, slots=True)
class FeatureLayout:
    """Where each part sits in a chunk's feature vector."""

    kind: str
    """``cedr-knrm`` or ``model1``."""
    hidden: int
    """Width of the pooled vector."""
    layers: int
    """Hidden states compared (the embeddings and every layer) for KNRM."""
    slots: int = QUERY_SLOTS
    """Query tokens read."""

    @property
    def bins(self) -> int:
        """KNRM's kernels or DRMM's histogram bins (per query slot and layer)."""
        return len(KERNEL_MUS) if self.kind == "cedr-knrm" else HISTOGRAM_BINS

    @property
    def sums(self) -> int:
        """Width of the chunk sums."""
        if self.kind == "cedr-pacrr":
            return self.slots * PACRR_NGRAMS * PACRR_K
        return self.slots + 1 if self.kind == "model1" else self.slots * self.layers * self.bins

    @property
    def width(self) -> int:
        """The whole feature vector."""
        return self.hidden + self.slots + self.sums

    def to_json(self) -> dict:
        return {"kind": self.kind, "hidden": self.hidden, "layers": self.layers, "slots": self.slots}

    @classmethod
    def from_json(cls, data: dict) -> FeatureLayout:
        return cls(data["kind"], int(data["hidden"]), int(data["layers"]), int(data["slots"]))
