"""Where the real model and judged data live (../shared beside the repository), and private copies of
the prepared models folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KEYRANK_SHARED", REPO.parent / "shared"))
CE_MODEL = SHARED / "models" / "ce-minilm-l6"
DATASETS = SHARED / "datasets"


def linked_copy(src: Path, dst: Path) -> Path:
    """A private copy of a prepared tree that costs no disk: big files are hard links (prepare
    replaces files by rename, so it never writes through a link into the original)."""
    from keyrank.prepare.export import LOCK_NAME

    shutil.copytree(src, dst, copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__", LOCK_NAME))
    return dst


def mixed_length_inputs(prepared: Path):
    """Real model inputs of very different lengths, as the GPU variants' tests score them: DL20 passages (short)
    and joined passages (long), framed by the prepared folder's pipeline."""
    from keyrank.bench.workloads import dl20_requests
    from keyrank.config import Settings
    from keyrank.pipeline import Pipeline, RerankOptions

    pipeline = Pipeline.from_model_dir(Settings(model_dir=prepared, document_cache_bytes=0))
    query, docs = dl20_requests(DATASETS, 1)[0]
    short = pipeline.plan(query, docs[:12], RerankOptions(strategy="firstp")).inputs
    long = pipeline.plan(query, [" ".join(docs[i : i + 8]) for i in range(0, 32, 8)], RerankOptions(strategy="firstp")).inputs
    return short + long


def embedded_scores(repository: Path, settings, inputs):
    """``inputs`` scored (logits and pooled vectors) by the real embedded tritonserver serving ``repository``."""
    import asyncio
    import time

    from keyrank.modelserver.embedded import EmbeddedTriton
    from keyrank.modelserver.repository import MODEL_NAME
    from keyrank.scoring.triton import TritonScorer

    with EmbeddedTriton(repository, settings=settings) as server:
        async def score():
            scorer = TritonScorer(server.grpc_url, model=MODEL_NAME, pad_id=0, buckets=[64, 128, 256, 384, 512], batch_size=8,
                                  max_shapes=4)
            try:
                return await scorer.score(inputs, want_pooled=True, deadline=time.monotonic() + 120)
            finally:
                await scorer.close()

        return asyncio.run(score())


def grpc_inputs(ids):
    """``tritonclient.grpc`` inputs of the cross-encoder for token ids ``ids`` [rows, width]: every token attended,
    one segment."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    tensors = []
    for name, array in (("input_ids", ids), ("attention_mask", np.ones_like(ids)), ("token_type_ids", np.zeros_like(ids))):
        tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors
