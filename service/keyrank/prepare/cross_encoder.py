"""PyTorch -> ONNX, checked: the cross-encoder (any supported reranker family, its
input framed by the model's own template) and the bi-encoder of the dense selector.

Every export is checked against PyTorch (fp32) on real pairs of different
lengths padded into one batch; above ``atol`` the export is refused.
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from keyrank.errors import KeyrankError
from keyrank.modelserver.repository import INPUTS as CE_INPUTS
from keyrank.modelserver.repository import MODEL_NAME

_OPSET = 17

# Real text of very different lengths: padding bugs (mask ignored, positions
# shifted) only show when short and long pairs share one padded batch.
_PASSAGE = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, "
    "a region in France. They were descended from Norse raiders and pirates from Denmark, Iceland "
    "and Norway who, under their leader Rollo, agreed to swear fealty to King Charles III of West Francia. "
)
CHECK_PAIRS = (
    ("what is a cat", "a cat is an animal"),
    ("how do cats purr", "Cats purr by vibrating the muscles of the larynx while breathing in and out."),
    ("who was rollo", _PASSAGE),
    ("in what country is normandy located", _PASSAGE * 12),  # past 512 tokens: truncated
    ("bananas", "no"),
)


class ExportMismatch(KeyrankError):
    """The ONNX graph does not reproduce the PyTorch model within ``atol``."""


# --- cross-encoder -------------------------------------------------------------


def export_cross_encoder(checkpoint: Path, onnx_path: Path, gateway: Path, atol: float, instruction: str | None = None) -> dict:
    """Export a sequence-classification reranker (logits, pooled) or a yes/no decoder reranker
    (logit(yes) - logit(no) of the last token, its hidden state as pooled), with the model's template."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    from keyrank.prepare.template import (
        DECODER_TYPES,
        DEFAULT_INSTRUCTION,
        check_family,
        derive_template,
    )

    started = time.perf_counter()
    config = AutoConfig.from_pretrained(checkpoint)
    check_family(config)  # an unsupported family fails here, before any weights are read
    decoder = config.model_type in DECODER_TYPES
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    hf_model = load_checkpoint(AutoModelForCausalLM if decoder else AutoModelForSequenceClassification, checkpoint)
    max_length = _max_length(tokenizer, hf_model.config)
    template = derive_template(
        tokenizer, config, uses_token_types=not decoder and _uses_segments(hf_model), max_length=max_length,
        instruction=instruction or DEFAULT_INSTRUCTION,
    )
    save_tokenizer(tokenizer.backend_tokenizer, gateway / "tokenizer.json", truncate_at=None)
    text_tokenizer = serving_tokenizer(gateway / "tokenizer.json", template)
    if not decoder:
        _check_pair_encoding(tokenizer, text_tokenizer, template)
    batch = template_batch(text_tokenizer, template, CHECK_PAIRS)
    # Traced on a smaller batch than it is checked on: a shape frozen into the graph then fails the check.
    dummy = template_batch(text_tokenizer, template, CHECK_PAIRS[:2])
    if decoder:
        wrapper = wrapper_classes()[2](hf_model, *template.yes_no).eval()
        head_name = "lm_head[yes] - lm_head[no]"
        weight = wrapper.direction.detach().numpy().astype(np.float32)
        bias = np.zeros(1, np.float32)
    else:
        head_name, head = final_linear(hf_model, batch)
        wrapper = wrapper_classes()[0](hf_model, head).eval()  # export restores the wrapper's flag: eval() or dropout stays on
        weight = head.weight.detach().numpy().astype(np.float32)
        bias = head.bias.detach().numpy().astype(np.float32)

    with torch.no_grad():
        ref_logits, ref_pooled = (t.numpy() for t in wrapper(*batch))
        if decoder:  # the padded batch must answer what the plain LM says, row by row, unpadded
            ref_logits = _decoder_reference(hf_model, batch, *template.yes_no)
    tmp = onnx_path.with_suffix(".onnx.tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    torch_export(wrapper, dummy, tmp, CE_INPUTS, ("logits", "pooled"))
    _ensure_inputs(tmp, CE_INPUTS)

    logits, pooled = run_onnx(tmp, batch, ("logits", "pooled"))
    diff = check_close("cross-encoder logits", ref_logits, logits, atol)
    diff_pooled = check_close("cross-encoder pooled", ref_pooled, pooled, atol)
    # The gateway applies the head to aggregated pooled vectors (PARADE): it must be the head ONNX used.
    check_close("classifier head on pooled", logits, pooled @ weight.T + bias, atol)

    os.replace(tmp, onnx_path)
    np.savez(gateway / "classifier_head.npz", weight=weight, bias=bias)
    return {
        "architecture": type(hf_model).__name__,
        "family": template.family,
        "head": head_name,
        "uses_token_type_ids": template.uses_token_types,
        "max_length": max_length,
        "hidden_size": int(weight.shape[1]),
        "num_labels": int(weight.shape[0]),
        "triton_model": MODEL_NAME,
        "template": template.to_json(),
        "onnx_max_abs_diff": diff,
        "onnx_max_abs_diff_pooled": diff_pooled,
        "onnx_bytes": onnx_path.stat().st_size,
        "export_seconds": round(time.perf_counter() - started, 1),
    }


def serving_tokenizer(path: Path, template):
    from keyrank.tokenize import TextTokenizer

    return TextTokenizer.from_file(path, text_lead=template.text_lead, special_ids=template.special_ids)


def template_batch(text_tokenizer, template, pairs, query_max_tokens: int = 32):
    """The check pairs as the gateway frames them (query cap, document cut to the budget), right-padded."""
    import torch

    rows = []
    for query, doc in pairs:
        q = text_tokenizer.encode_query(query, query_max_tokens)
        (d,) = text_tokenizer.encode_documents([doc])
        end = min(len(d), template.document_budget(len(q)))
        rows.append(template.build(q.ids, d.ids, [0], [end]))
    width = max(len(ids) for ids, _ in rows)
    ids = np.full((len(rows), width), template.pad_id, np.int64)
    types = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for r, (row_ids, row_types) in enumerate(rows):
        ids[r, : len(row_ids)], types[r, : len(row_ids)], mask[r, : len(row_ids)] = row_ids, row_types, 1
    return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types)


def _check_pair_encoding(tokenizer, text_tokenizer, template) -> None:
    """The template must frame short pairs exactly as the model's own tokenizer does."""
    for query, doc in CHECK_PAIRS[:3]:
        own = tokenizer(query, doc)
        q = text_tokenizer.encode_query(query, 10_000)
        (d,) = text_tokenizer.encode_documents([doc])
        ids, types = template.build(q.ids, d.ids, [0], [len(d)])
        own_types = own.get("token_type_ids") if template.uses_token_types else None
        if ids.tolist() != list(own["input_ids"]) or (own_types is not None and types.tolist() != list(own_types)):
            raise ExportMismatch(f"input template differs from {type(tokenizer).__name__}'s pair encoding on {query!r}")


def _decoder_reference(model, batch, yes: int, no: int) -> np.ndarray:

    input_ids, mask, _ = batch
    out = []
    for row, row_mask in zip(input_ids, mask):
        logits = model(input_ids=row[row_mask.bool()][None]).logits[0, -1]
        out.append([(logits[yes] - logits[no]).item()])
    return np.asarray(out, np.float32)


@functools.cache
def wrapper_classes():
    """The torch.nn.Module wrappers, built on first use: the gateway imports no torch."""
    import torch

    class LogitsAndPooled(torch.nn.Module):
        """(logits, pooled) where pooled is whatever the final Linear reads: [CLS] pooler output for
        BERT, the dense+tanh features for RoBERTa/XLM-R/ELECTRA heads, ..."""

        def __init__(self, model, head):
            super().__init__()
            self.model = model
            self._seen: list = []
            head.register_forward_hook(lambda _m, inputs, _out: self._seen.append(inputs[0]))

        def forward(self, input_ids, attention_mask, token_type_ids):
            self._seen.clear()
            logits = self.call(self.model, input_ids, attention_mask, token_type_ids).logits
            return logits, self._seen[-1]

        @staticmethod
        def call(model, input_ids, attention_mask, token_type_ids):
            """The HF forward, with segment ids only for models that learned them."""
            kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
            if _uses_segments(model):
                kwargs["token_type_ids"] = token_type_ids
            return model(**kwargs)

    class MeanPooledEncoder(torch.nn.Module):
        """Sentence-transformers' mean pooling over unmasked tokens, then L2 normalisation."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = LogitsAndPooled.call(self.model, input_ids, attention_mask, token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2, dim=1)

    class YesNoLastToken(torch.nn.Module):
        """Decoder rerankers (Qwen3-Reranker style): logit(yes) - logit(no) at each row's last real
        token (rows are right-padded: the last real token is at mask.sum() - 1), and that token's
        final hidden state as the pooled vector, so the head (W_yes - W_no) also serves PARADE."""

        def __init__(self, model, yes: int, no: int):
            super().__init__()
            self.model = model
            weight = model.get_output_embeddings().weight
            self.register_buffer("direction", (weight[yes] - weight[no]).detach().clone()[None])

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            last = attention_mask.sum(1) - 1
            pooled = hidden[torch.arange(hidden.shape[0]), last]
            return pooled @ self.direction.T, pooled

    return LogitsAndPooled, MeanPooledEncoder, YesNoLastToken


def _uses_segments(model) -> bool:
    """Whether the model learned segment ids. DistilBERT has none and RoBERTa/XLM-R only type 0: their
    template (``uses_token_types`` False) sends all zeros, and the export does not pass the input to their
    forward at all, so an id past their table can never reach it. BERT-style models get the types their own
    tokenizer writes (0 for the query, 1 for the document)."""
    import inspect

    accepts = "token_type_ids" in inspect.signature(model.forward).parameters
    return accepts and getattr(model.config, "type_vocab_size", 2) > 1


def load_checkpoint(auto_class, checkpoint: Path):
    import torch

    try:  # eager attention traces to plain ops every ONNX runtime knows
        model = auto_class.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager")
    except (TypeError, ValueError):
        model = auto_class.from_pretrained(checkpoint, dtype=torch.float32)
    return model.eval()


def _max_length(tokenizer, config) -> int:
    """The model's own longest input: its position embeddings (from its config), cut to the tokenizer's limit
    when that is smaller. Tokenizers without a limit report a huge sentinel; decoders' tokenizers often state
    more than the positions (Qwen3: 131072 of 40960)."""
    from keyrank.prepare.template import ENCODER_FAMILIES

    positions = int(getattr(config, "max_position_embeddings", None) or 512)
    if ENCODER_FAMILIES.get(getattr(config, "model_type", "")) == "roberta":
        # RoBERTa-likes number positions from padding_idx + 1 (514 -> 512, bge-reranker-v2-m3's 8194 -> 8192).
        pad = getattr(config, "pad_token_id", None)
        positions -= (1 if pad is None else int(pad)) + 1
    limit = getattr(tokenizer, "model_max_length", None)
    return int(min(limit, positions)) if limit else positions


def final_linear(model, batch):
    """The nn.Linear whose output IS the logits (BERT `classifier`, RoBERTa `classifier.out_proj`, ...)."""
    import torch

    calls: list[tuple[str, torch.nn.Module, torch.Tensor]] = []
    hooks = [
        module.register_forward_hook(lambda m, _i, out, name=name: calls.append((name, m, out)))
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    ]
    try:
        with torch.no_grad():
            logits = wrapper_classes()[0].call(model, *batch).logits
    finally:
        for hook in hooks:
            hook.remove()
    for name, module, out in reversed(calls):
        if out.shape == logits.shape and torch.equal(out, logits):
            return name, module
    raise KeyrankError(f"{type(model).__name__}: no nn.Linear produces the logits; cannot expose the pooled vector")


def torch_export(module, batch, path: Path, inputs: Sequence[str], outputs: Sequence[str]) -> None:
    import torch

    axes = {name: {0: "batch", 1: "sequence"} for name in inputs} | {name: {0: "batch"} for name in outputs}
    # Tracer warnings (shape-dependent Python branches in HF code) are what the check on a batch of
    # another shape settles, so they are silenced rather than shown to every user.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, tuple(batch), str(path), input_names=list(inputs), output_names=list(outputs),
            dynamic_axes=axes, opset_version=_OPSET, dynamo=False,
        )


def _ensure_inputs(path: Path, names: Sequence[str]) -> None:
    """Triton's config declares all three inputs; a model without segment ids (DistilBERT, some
    RoBERTa exports) loses the unused one in tracing, so it is put back as an ignored input."""
    import onnx
    from onnx import TensorProto, helper

    graph_model = onnx.load(str(path))
    present = {i.name for i in graph_model.graph.input}
    missing = [n for n in names if n not in present]
    if missing:
        for name in missing:
            graph_model.graph.input.append(helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"]))
        onnx.save(graph_model, str(path))


def run_onnx(path: Path, batch, outputs: Sequence[str]) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feeds = {name: t.numpy() for name, t in zip(CE_INPUTS, batch) if name in names}
    return session.run(list(outputs), feeds)


def check_close(what: str, reference: np.ndarray, exported: np.ndarray, atol: float) -> float:
    """Max abs difference; above ``atol`` the export is refused."""
    diff = float(np.max(np.abs(np.asarray(reference, np.float64) - np.asarray(exported, np.float64))))
    if not diff <= atol:  # NaN fails too
        raise ExportMismatch(f"{what}: ONNX differs from PyTorch by {diff:.3g} > atol {atol:g}")
    return diff


def save_tokenizer(backend, path: Path, truncate_at: int | None) -> None:
    """tokenizers' JSON; padding is the caller's business (length buckets), truncation only for the bi-encoder."""
    from tokenizers import Tokenizer

    data = json.loads(backend.to_str())
    # Every added token is marked special, so the gateway's encode_special_tokens keeps text that spells
    # one (``<think>``, ``[SEP]``) as the plain text it is.
    for token in data.get("added_tokens") or []:
        token["special"] = True
    # Unigram vocabularies (XLM-R, DeBERTa-v3) hold the special pieces themselves, with the best score
    # there is (0.0): the text "<s>" would still become <s>. Text must spell them from ordinary pieces.
    model = data.get("model") or {}
    if model.get("type") == "Unigram":
        specials = {t["content"] for t in data.get("added_tokens") or []}
        floor = min((score for _, score in model["vocab"]), default=0.0) - 100.0
        model["vocab"] = [[piece, floor if piece in specials else score] for piece, score in model["vocab"]]
    tok = Tokenizer.from_str(json.dumps(data))
    tok.no_padding()
    if truncate_at is None:
        tok.no_truncation()
    else:
        tok.enable_truncation(max_length=truncate_at)
    tmp = path.with_suffix(".json.tmp")
    tok.save(str(tmp))
    os.replace(tmp, path)
