"""The model under training, behind the same wrapper ``keyrank prepare`` exports.

The forward that training differentiates is the export's own module
(``LogitsAndPooled``: the HF model, its logits and the vector its final Linear
reads; ``YesNoLastToken`` for decoder rerankers), so what is trained is what
the ONNX graph computes. Document scores per strategy: one sequence (firstp,
keyb2), the max over windows (maxp), log-sum-exp of the inputs' logits (keyb2-blocks),
PARADE-max/-avg over the pooled vectors through the model's own head, or a PARADE aggregator
over the windows' pooled vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from keyrank.prepare.cross_encoder import final_linear, wrapper_classes
from keyrank.scoring import ModelInputs
from keyrank.template import DECODER_TYPES, InputTemplate

ATTENTION_DROPOUT = ("attention_probs_dropout_prob", "attention_dropout")
"""Config keys of attention-probability dropout (BERT-likes; ModernBERT, decoders). On CPU, dropout over
the [heads, L, L] attention maps costs about as much as the attention itself, and it keeps SDPA's fused
kernel off: fine-tuning runs without it unless asked (``FinetuneConfig.attention_dropout``)."""


def _load(auto_class, checkpoint, config):
    """fp32 weights, SDPA attention where the model has it (the same function as the export's eager graph,
    about 1.5x faster to train on CPU), else eager."""
    for implementation in ("sdpa", "eager"):
        try:
            return auto_class.from_pretrained(checkpoint, config=config, dtype=torch.float32, attn_implementation=implementation)
        except (TypeError, ValueError, ImportError):
            continue
    return auto_class.from_pretrained(checkpoint, config=config, dtype=torch.float32)


@dataclass(frozen=True, slots=True)
class Batch:
    """Sequences of some documents, right-padded to the longest."""

    input_ids: torch.Tensor
    """int64 [N, L]."""
    attention_mask: torch.Tensor
    """int64 [N, L] 1 on tokens, 0 on padding."""
    token_type_ids: torch.Tensor
    """int64 [N, L] 0 on padding."""
    token_roles: torch.Tensor | None = None
    """int64 [N, L] query / document / frame positions, 0 on padding (interaction graphs; None without roles)."""

    @classmethod
    def of(cls, inputs: ModelInputs, pad_id: int, device: torch.device | str = "cpu") -> Batch:
        width = max(len(ids) for ids in inputs.ids)
        ids = np.full((len(inputs), width), pad_id, np.int64)
        mask = np.zeros((len(inputs), width), np.int64)
        types = np.zeros((len(inputs), width), np.int64)
        roles = None if inputs.roles is None else np.zeros((len(inputs), width), np.int64)
        for row, (row_ids, row_types) in enumerate(zip(inputs.ids, inputs.types)):
            ids[row, : len(row_ids)], types[row, : len(row_ids)], mask[row, : len(row_ids)] = row_ids, row_types, 1
            if roles is not None:
                roles[row, : len(row_ids)] = inputs.roles[row]
        return cls(*(torch.from_numpy(a).to(device) for a in (ids, mask, types)),
                   None if roles is None else torch.from_numpy(roles).to(device))


class CrossEncoder(torch.nn.Module):
    """A Hugging Face reranker checkpoint: ``forward(batch) -> (relevance [N], pooled [N, H])``."""

    def __init__(self, checkpoint: Path | str, template: InputTemplate, probe: ModelInputs, *, attention_dropout: float | None = None):
        super().__init__()
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForSequenceClassification,
            AutoTokenizer,
        )

        logits_and_pooled, _, yes_no = wrapper_classes()
        config = AutoConfig.from_pretrained(checkpoint)
        decoder = config.model_type in DECODER_TYPES
        # The checkpoint's own values, written back on save: the override is a training-time choice.
        self._restore = {k: getattr(config, k) for k in ATTENTION_DROPOUT if hasattr(config, k)}
        if attention_dropout is not None:
            for key in self._restore:
                setattr(config, key, attention_dropout)
        self.hf = _load(AutoModelForCausalLM if decoder else AutoModelForSequenceClassification, checkpoint, config)
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.template = template
        if decoder:
            self.wrapper = yes_no(self.hf, *template.yes_no)
            self._head = lambda pooled: pooled @ self.wrapper.direction.T
        else:
            batch = Batch.of(probe, template.pad_id)
            _, head = final_linear(self.hf, (batch.input_ids, batch.attention_mask, batch.token_type_ids))
            self.wrapper = logits_and_pooled(self.hf, head)
            self._head = head

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits, pooled = self.wrapper(batch.input_ids, batch.attention_mask, batch.token_type_ids)
        return logits.reshape(logits.shape[0], -1)[:, -1], pooled

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        """The relevance logit of pooled vectors [N, H] -> [N]: the model's own final Linear (trained with it),
        which PARADE-max/-avg apply to the folded vectors as the gateway applies ``classifier_head.npz``."""
        out = self._head(pooled)
        return out.reshape(out.shape[0], -1)[:, -1]

    def save(self, folder: Path) -> None:
        """A checkpoint folder ``keyrank prepare --model`` reads: weights (fp32), config, tokenizer."""
        folder.mkdir(parents=True, exist_ok=True)
        changed = {k: getattr(self.hf.config, k) for k in self._restore}
        for key, value in self._restore.items():
            setattr(self.hf.config, key, value)
        self.hf.save_pretrained(folder)
        for key, value in changed.items():
            setattr(self.hf.config, key, value)
        self.tokenizer.save_pretrained(folder)


def fold(method: str, relevance: torch.Tensor, pooled: torch.Tensor | None, doc_of: np.ndarray, n_docs: int,
         aggregator: torch.nn.Module | None = None, head=None) -> torch.Tensor:
    """Document scores [n_docs] from sequence scores, as serving aggregates them (aggregate.py): PARADE-max/-avg
    fold the pooled vectors and apply ``head`` (the encoder's own final Linear, so it trains too)."""
    if method == "single":
        if relevance.shape[0] != n_docs:
            raise ValueError("'single' needs one sequence per document")
        return relevance
    if method == "max":
        index = torch.as_tensor(doc_of, device=relevance.device)
        init = torch.full((n_docs,), float("-inf"), device=relevance.device, dtype=relevance.dtype)
        return init.scatter_reduce(0, index, relevance, reduce="amax", include_self=True)
    if method == "lse":  # log of the summed exp, shifted by each document's max so that nothing overflows
        best = fold("max", relevance.detach(), None, doc_of, n_docs)
        index = torch.as_tensor(doc_of, device=relevance.device)
        spread = torch.zeros(n_docs, device=relevance.device, dtype=relevance.dtype)
        return best + spread.index_add(0, index, torch.exp(relevance - best[index])).log()
    if method == "trained":
        padded, mask = pad_pooled(pooled, doc_of, n_docs)
        return aggregator(padded, mask)
    if method in ("parade-max", "parade-avg"):
        if pooled is None or head is None:
            raise ValueError(f"{method} needs the pooled vectors and the classifier head")
        index = torch.as_tensor(doc_of, device=pooled.device)[:, None].expand_as(pooled)
        init = torch.full((n_docs, pooled.shape[1]), float("-inf") if method == "parade-max" else 0.0,
                          device=pooled.device, dtype=pooled.dtype)
        folded = init.scatter_reduce(0, index, pooled, reduce="amax" if method == "parade-max" else "mean",
                                     include_self=method == "parade-max")
        return head(folded)
    raise ValueError(f"training has no aggregation {method!r}")


def pad_pooled(pooled: torch.Tensor, doc_of: np.ndarray, n_docs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable ``aggregators.pad_by_document``: [S, H] grouped by document -> [D, W, H], [D, W]."""
    counts = np.bincount(doc_of, minlength=n_docs)
    slot = np.arange(doc_of.shape[0]) - np.concatenate(([0], np.cumsum(counts)[:-1]))[doc_of]
    padded = pooled.new_zeros((n_docs, max(1, int(counts.max())), pooled.shape[1]))
    mask = pooled.new_zeros((n_docs, padded.shape[1]))
    rows, cols = torch.as_tensor(doc_of, device=pooled.device), torch.as_tensor(slot, device=pooled.device)
    padded = padded.index_put((rows, cols), pooled)
    mask[rows, cols] = 1.0
    return padded, mask
