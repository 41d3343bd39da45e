"""Dense selector: cosine between the query and each block under all-MiniLM-L6-v2.

The bi-encoder runs in-process (``models/gateway/bi_encoder/``, written by `keyrank prepare`):
on OpenVINO in bfloat16 where the CPU computes it (AVX512_BF16, AMX) and OpenVINO is installed,
2.6x ONNX Runtime's fp32 on this project's 2-core Xeon with the same nDCG@10 on dev, else on
ONNX Runtime (``dense_runtime``; docs/PERFORMANCE.md section 7). Mean pooling and L2 normalisation
are inside the graph, so a cosine is a dot product. Block embeddings are cached by
(model, text): candidate sets repeat documents across requests, and a cached
block costs nothing. Missing texts are batched by token length, texts of one length together, so no
batch is padded and a text's vector never depends on the others of its request. ONNX Runtime's CPU
kernels also round a row by the batch's row count (on a 2-core AVX2 EPYC: 4e-8 between a text alone and
in a batch of 64), so there every batch holds ``ORT_ROWS`` texts, a short one filled with copies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from keyrank import metrics
from keyrank.errors import ModelAssetsMissing
from keyrank.scoring import openvino
from keyrank.scoring.local import run_options, session_options

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keyrank.select import SelectorContext
    from keyrank.segment import Spans
    from keyrank.tokenize import Encoded


log = logging.getLogger(__name__)

ORT_ROWS = 8
"""Texts in every ONNX Runtime batch. On the AVX2 EPYC, with 16-78-token texts, 8 a batch ran at 0.88-1.22x
the speed of 64 (faster from 44 tokens on, the length of most blocks) and 1.25-1.9x faster than one at a time;
a text's vector was the same bit for bit at any place in a batch of 8 with any others (2026-11-27)."""
RUNTIMES = ("auto", "onnxruntime", "openvino")
"""``dense_runtime``: ``auto`` = OpenVINO where this CPU computes bfloat16 and OpenVINO is installed, else ONNX
Runtime; ``openvino`` = OpenVINO (bf16 where the CPU has it, else f32); ``onnxruntime`` = ONNX Runtime fp32."""


def pick_runtime(runtime: str) -> str:
    """The runtime ``runtime`` names on this machine: ``onnxruntime`` or ``openvino``."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown bi-encoder runtime {runtime!r}; expected one of {', '.join(RUNTIMES)}")
    if runtime == "auto":
        return "openvino" if openvino.bf16_supported() else "onnxruntime"
    if runtime == "openvino" and not openvino.available():
        raise ModelAssetsMissing("the bi-encoder's runtime is openvino, but OpenVINO is not installed (the embedded extra has it)")
    return runtime


def pad_batch(encodings: Sequence[Encoding], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """input_ids, attention_mask, token_type_ids: int64 [N, longest] from ``tokenizers`` encodings."""
    longest = max((len(e.ids) for e in encodings), default=0)
    ids = np.full((len(encodings), longest), pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, enc in enumerate(encodings):
        ids[row, : len(enc.ids)] = enc.ids
        mask[row, : len(enc.ids)] = 1
    return ids, mask, np.zeros_like(ids)


class EmbeddingCache:
    """Thread-safe LRU of embeddings keyed by (model identity, text)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        """Most entries kept; 0 disables caching."""
        self._entries: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get_many(self, model: str, texts: Sequence[str]) -> list[np.ndarray | None]:
        with self._lock:
            found = []
            for text in texts:
                vector = self._entries.get((model, text))
                if vector is not None:
                    self._entries.move_to_end((model, text))
                found.append(vector)
            return found

    def put_many(self, model: str, texts: Sequence[str], vectors: np.ndarray) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            for text, vector in zip(texts, vectors):
                self._entries[(model, text)] = vector
                self._entries.move_to_end((model, text))
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)


class DenseSelector:
    """Scores blocks by cosine with the query (bi-encoder in-process, OpenVINO or ONNX Runtime). Thread-safe."""

    def __init__(self, model_dir: Path, *, cache_size: int, batch_size: int = 64, threads: int = 0, runtime: str = "auto"):
        """``model_dir``: the bi-encoder folder, or the prepared model directory holding gateway/bi_encoder/;
        ``runtime``: one of ``RUNTIMES``."""
        folder = _bi_encoder_folder(Path(model_dir))
        self.batch_size = batch_size
        """Texts per bi-encoder run."""
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_padding()  # a batch holds texts of one length (_compute)
        self._pad_id = self._tokenizer.token_to_id("[PAD]") or 0
        self.runtime = pick_runtime(runtime)
        """What computes the embeddings: ``openvino`` or ``onnxruntime``."""
        if self.runtime == "openvino":
            session = openvino.OpenVinoSession(folder / "model.onnx", precision="bf16", threads=threads)
            self._inputs = list(session.input_names)
            self._output = session.compiled.outputs[0].get_any_name()
            self.dim = int(session.compiled.outputs[0].get_partial_shape()[1].get_length())
            self._one_at_a_time: contextlib.AbstractContextManager = threading.Lock()  # one infer request
            self.precision = session.precision
            self._rows: int | None = None  # batches of up to batch_size: the same vectors at any size
        else:
            session = ort.InferenceSession(str(folder / "model.onnx"), session_options(threads), providers=["CPUExecutionProvider"])
            self._inputs = [i.name for i in session.get_inputs()]
            self._output = session.get_outputs()[0].name
            self.dim = int(session.get_outputs()[0].shape[1])
            self._one_at_a_time = contextlib.nullcontext()  # ONNX Runtime sessions run concurrently
            self.precision = "f32"
            self._rows = ORT_ROWS
        self._session = session
        """``dim``: embedding width (384 for all-MiniLM-L6-v2); ``precision``: ``bf16`` or ``f32``."""
        log.info("bi-encoder %s on %s (%s)", folder, self.runtime, self.precision)
        self.model_id = _model_identity(folder)
        """Cache key part: the exported weights' fingerprint, so a re-prepared model never reads stale vectors."""
        self.cache = EmbeddingCache(cache_size)
        """Block (and query) embeddings, shared by all threads."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [n, dim], unit length, in the order of ``texts``."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        cached = self.cache.get_many(self.model_id, texts)
        missing: dict[str, list[int]] = {}
        for row, (text, vector) in enumerate(zip(texts, cached)):
            if vector is None:
                missing.setdefault(text, []).append(row)
            else:
                out[row] = vector
        # A text repeated within one call is computed once; its repeats count as hits.
        metrics.CACHE_HITS.labels(cache="dense").inc(len(texts) - len(missing))
        metrics.CACHE_MISSES.labels(cache="dense").inc(len(missing))
        if missing:
            new_texts = list(missing)
            vectors = self._compute(new_texts)
            for text, vector in zip(new_texts, vectors):
                out[missing[text]] = vector
            self.cache.put_many(self.model_id, new_texts, vectors)
        return out

    def score(self, query_text: str, query: Encoded, docs: list[Encoded], pieces: list[Spans]) -> list[np.ndarray]:
        """The ``dense`` selector (``BlockSelector``): the cosine of the query text and each block's text."""
        texts = [[d.text[slice(*d.char_span(a, b))] for a, b in zip(sp.starts, sp.ends)] for d, sp in zip(docs, pieces)]
        return self.score_blocks(query_text, texts)

    def score_blocks(self, query: str, block_texts: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Cosine of every block of every document with the query: float32 [blocks of doc] per document."""
        if not block_texts:
            return []
        flat = [text for blocks in block_texts for text in blocks]
        vectors = self.embed([query, *flat])
        scores = (vectors[1:] * vectors[0]).sum(axis=1)  # row by row: a matrix product rounds a row by its place
        bounds = np.cumsum([len(blocks) for blocks in block_texts], dtype=np.int64)[:-1]
        return np.split(scores.astype(np.float32), bounds)

    def _compute(self, texts: list[str]) -> np.ndarray:
        """Texts of one token length run together, never padded: a text's vector then does not depend on the
        other texts of the call (in bf16 a padded batch moves it by ~1e-4, enough to swap two nearly tied blocks
        and make a document's score depend on the other candidates)."""
        encodings = self._tokenizer.encode_batch(texts)
        lengths = np.array([len(e.ids) for e in encodings])
        vectors = np.empty((len(texts), self.dim), dtype=np.float32)
        size = self.batch_size if self._rows is None else self._rows
        for length in np.unique(lengths):
            group = np.flatnonzero(lengths == length)
            for start in range(0, len(group), size):
                rows = group[start : start + size]
                batch = [encodings[r] for r in rows]
                if self._rows is not None:  # always the same shape: the short batch filled with copies
                    batch += [batch[0]] * (self._rows - len(batch))
                arrays = pad_batch(batch, self._pad_id)
                feeds = {name: array for name, array in zip(("input_ids", "attention_mask", "token_type_ids"), arrays)}
                with self._one_at_a_time:
                    (embedding,) = self._session.run([self._output], {name: feeds[name] for name in self._inputs}, run_options())
                vectors[rows] = embedding[: len(rows)]
        return vectors


def _bi_encoder_folder(model_dir: Path) -> Path:
    for folder in (model_dir, model_dir / "gateway" / "bi_encoder", model_dir / "bi_encoder"):
        if (folder / "model.onnx").exists() and (folder / "tokenizer.json").exists():
            return folder
    raise ModelAssetsMissing(f"no bi-encoder under {model_dir}: run `keyrank prepare` (without --no-bi-encoder)")


def _model_identity(folder: Path) -> str:
    """The fingerprint `keyrank prepare` recorded, else the ONNX file's size and mtime."""
    manifest = folder.parent / "manifest.json"
    if manifest.exists():
        entry = json.loads(manifest.read_text()).get("bi_encoder") or {}
        if entry.get("fingerprint"):
            return str(entry["fingerprint"])
    stat = (folder / "model.onnx").stat()
    return f"{stat.st_size}-{stat.st_mtime_ns}"


def build(context: SelectorContext) -> DenseSelector:
    """The ``dense`` selector of a pipeline: its prepared bi-encoder, with the settings' cache and batch size."""
    s = context.settings
    if context.gateway_dir is None:
        raise ModelAssetsMissing("the dense selector needs a prepared model folder (keyrank prepare)")
    return DenseSelector(context.gateway_dir / "bi_encoder", cache_size=s.dense_cache_size, batch_size=s.dense_batch_size,
                         threads=s.dense_threads, runtime=s.dense_runtime)
