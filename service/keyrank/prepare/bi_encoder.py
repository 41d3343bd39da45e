"""`keyrank prepare` for the dense selector: all-MiniLM-L6-v2 (or another mean-pooled
sentence-transformers model) to ONNX, checked against sentence-transformers itself."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from keyrank.errors import KeyrankError
from keyrank.prepare.cross_encoder import (
    CHECK_PAIRS,
    check_close,
    load_checkpoint,
    run_onnx,
    save_tokenizer,
    torch_export,
    wrapper_classes,
)
from keyrank.modelserver.repository import INPUTS as CE_INPUTS


def export_bi_encoder(checkpoint: Path, out_dir: Path, atol: float) -> dict:
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
    save_tokenizer(backend, out_dir / "tokenizer.json", max_length)
    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    texts = [q for q, _ in CHECK_PAIRS] + [p for _, p in CHECK_PAIRS]
    # Padded exactly as the dense selector pads, so the check covers its inputs too.
    batch = [torch.from_numpy(a) for a in pad_batch(tokenizer.encode_batch(texts))]
    dummy = [torch.from_numpy(a) for a in pad_batch(tokenizer.encode_batch(texts[:2]))]

    wrapper = wrapper_classes()[1](load_checkpoint(AutoModel, checkpoint)).eval()
    tmp = out_dir / "model.onnx.tmp"
    torch_export(wrapper, dummy, tmp, CE_INPUTS, ("embedding",))
    (embedding,) = run_onnx(tmp, batch, ("embedding",))
    diff = check_close("bi-encoder embedding", _reference_embeddings(checkpoint, texts, wrapper, batch), embedding, atol)
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


