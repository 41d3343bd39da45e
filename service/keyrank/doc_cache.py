"""The document cache: a document reranked again costs no tokenizing, segmenting or term counting.

Search backends send popular documents again and again; for keyb2 the gateway's
CPU work (tokenize 2k tokens, cut blocks, count BM25 terms) is far more than
the one sequence the GPU scores. Each document's token ids and offsets, its
CogLTX blocks and the BM25 terms of those blocks are kept by content hash:

- key: SHA-256 (hardware-accelerated, ~1.5 GB/s; a crafted collision cannot
  poison another caller's document) of the text, seeded with everything the
  arrays depend on: the tokenizer, the template's text lead and special ids,
  the block size and cost. Another model or setting never reads an entry;
- entries hold arrays only, never the text: a hit is the caller's own text,
  equal by hash, so offsets still slice it;
- bounded in bytes (``document_cache_bytes``), least recently used out first;
  hits, misses, bytes and evictions are Prometheus metrics.

Tokens are cached whole; a ``max_tokens_per_doc`` cut is applied on the way
out (a view). Blocks and terms depend on the cut (the DP is global), so they
are kept per number of tokens read. Windows are not cached: they are an
``arange`` of the document's length.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import numpy as np

from keyrank import metrics
from keyrank.config import Settings
from keyrank.segment import Spans
from keyrank.template import InputTemplate
from keyrank.tokenize import Encoded, TextTokenizer

T = TypeVar("T")

_ENTRY_OVERHEAD = 400
"""Bytes charged per entry beyond its arrays (key, dict slots, small objects)."""


@dataclass(slots=True)
class CachedDocument:
    """What the CPU stages computed for one text."""

    ids: np.ndarray
    """int64 [n] every token id of the text (no cut applied)."""
    offsets: np.ndarray
    """int32 [n, 2] character span of each token."""
    blocks: dict[int, Spans] = field(default_factory=dict)
    """CogLTX blocks, by the number of tokens read (a cut changes the DP)."""
    terms: dict[int, Any] = field(default_factory=dict)
    """What the BM25 selector reads of those blocks, by tokens read (``bm25.BlockTerms``: term ids [T], local
    block of each [T], terms per block [k])."""
    nbytes: int = 0
    """What this entry is charged against the bound."""


def namespace(tokenizer: TextTokenizer, template: InputTemplate, settings: Settings) -> bytes:
    """Everything the cached arrays depend on, as the bytes that seed the key hash."""
    # The tokenizer's full JSON (vocabulary, normalizer, pre-tokenizer): a re-prepared model never hits.
    tokenizer_json = tokenizer._tok.to_str()  # TextTokenizer keeps no public copy
    cut = {"template": template.to_json(), "block_max_tokens": settings.block_max_tokens, "block_cost": settings.block_cost}
    return hashlib.sha256(tokenizer_json.encode() + b"\0" + json.dumps(cut, sort_keys=True).encode()).digest()


class DocumentCache:
    """Thread-safe LRU of ``CachedDocument`` by content hash, bounded in bytes; 0 bytes = off."""

    def __init__(self, max_bytes: int, seed: bytes = b""):
        self.max_bytes = max_bytes
        """Most bytes of arrays kept; 0 disables the cache."""
        self._seed = hashlib.sha256(seed)
        self._entries: OrderedDict[bytes, CachedDocument] = OrderedDict()
        # id(ids array) -> key: a document handed out by ``encode`` is found again in ``blocks`` and
        # ``block_terms`` without hashing its text twice (the entry holds the array, so the id is live).
        self._owner: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self.bytes = 0
        """Bytes charged now."""
        self.hits = 0
        """Documents found (encode lookups)."""
        self.misses = 0
        """Documents tokenized (encode lookups)."""

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, text: str) -> bytes:
        h = self._seed.copy()
        h.update(text.encode("utf-8", "surrogatepass"))
        return h.digest()[:16]

    # --- stage 1: tokens ---------------------------------------------------------------------
    def encode(
        self, texts: Sequence[str], max_tokens: int | None, tokenize: Callable[[list[str]], list[Encoded]]
    ) -> list[Encoded]:
        """Each text's tokens, from the cache or from one batched ``tokenize`` call over the misses."""
        if not self.enabled:
            return [_cut(e.ids, e.offsets, e.text, max_tokens) for e in tokenize(list(texts))]
        keys = [self.key(t) for t in texts]
        with self._lock:
            found = [self._get(k) for k in keys]
        first: dict[bytes, int] = {}  # a text repeated inside the request is tokenized once
        for i, (k, entry) in enumerate(zip(keys, found)):
            if entry is None and k not in first:
                first[k] = i
        if first:
            missing = list(first.values())
            encoded = tokenize([texts[i] for i in missing])
            with self._lock:
                for i, enc in zip(missing, encoded):
                    entry = CachedDocument(enc.ids, enc.offsets, nbytes=_ENTRY_OVERHEAD + enc.ids.nbytes + enc.offsets.nbytes)
                    _freeze(enc.ids, enc.offsets)  # shared by every later request: a write would corrupt them all
                    self._put(keys[i], entry)
                    found[i] = entry
            found = [entry if entry is not None else found[first[k]] for k, entry in zip(keys, found)]
        with self._lock:
            self.hits += len(texts) - len(first)
            self.misses += len(first)
        metrics.CACHE_HITS.labels(cache="documents").inc(len(texts) - len(first))
        metrics.CACHE_MISSES.labels(cache="documents").inc(len(first))
        return [_cut(e.ids, e.offsets, t, max_tokens) for e, t in zip(found, texts)]

    # --- stage 2: blocks -----------------------------------------------------------------------
    def blocks(self, docs: Sequence[Encoded], cut: Callable[[Encoded], Spans]) -> list[Spans]:
        """Each document's blocks, from the cache or from ``cut`` (kept for next time)."""
        if not self.enabled:
            return [cut(d) for d in docs]
        out = []
        for d in docs:
            entry = self._entry_of(d)
            spans = entry.blocks.get(len(d)) if entry is not None else None
            if spans is None:
                spans = cut(d)
                if entry is not None:
                    with self._lock:
                        _freeze(spans.starts, spans.ends)
                        entry.blocks[len(d)] = spans
                        self._charge(entry, spans.starts.nbytes + spans.ends.nbytes)
            out.append(spans)
        return out

    # --- stage 3: what the BM25 selector reads of the blocks --------------------------------------
    def block_terms(self, docs: Sequence[Encoded], pieces: Sequence[Spans], extract: Callable[[Encoded, Spans], T]) -> list[T]:
        """Each document's ``extract`` of its blocks (the BM25 terms, ``bm25.document_terms``), from the cache or
        from ``extract``; kept for next time when they are the very blocks this cache handed out (other pieces:
        computed). What ``extract`` returns is a dataclass of arrays (``bm25.BlockTerms``), frozen once kept."""
        parts = []
        for d, spans in zip(docs, pieces):
            entry = self._entry_of(d) if self.enabled else None
            ours = entry is not None and entry.blocks.get(len(d)) is spans
            part = entry.terms.get(len(d)) if ours else None
            if part is None:
                part = extract(d, spans)
                if ours:
                    arrays = [getattr(part, f.name) for f in fields(part)]
                    with self._lock:
                        _freeze(*arrays)
                        entry.terms[len(d)] = part
                        self._charge(entry, sum(a.nbytes for a in arrays))
            parts.append(part)
        return parts

    # --- bookkeeping (under the lock) ----------------------------------------------------------
    def _entry_of(self, doc: Encoded) -> CachedDocument | None:
        """The entry ``doc`` was handed out from, else the entry of its text, else None."""
        base = doc.ids if doc.ids.base is None else doc.ids.base
        with self._lock:
            key = self._owner.get(id(base))
            entry = self._entries.get(key) if key is not None else None
            if entry is not None and entry.ids is base:
                return entry
        key = self.key(doc.text)
        with self._lock:
            entry = self._entries.get(key)
        # Same text, same tokenizer: the arrays must agree with what the caller holds.
        return entry if entry is not None and entry.ids.shape[0] >= len(doc) else None

    def _get(self, key: bytes) -> CachedDocument | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def _put(self, key: bytes, entry: CachedDocument) -> None:
        if entry.nbytes > self.max_bytes:
            return  # larger than the whole cache: served, never kept
        old = self._entries.pop(key, None)
        if old is not None:
            self._forget(key, old)
        self._entries[key] = entry
        self._owner[id(entry.ids)] = key
        self.bytes += entry.nbytes
        self._evict()

    def _charge(self, entry: CachedDocument, nbytes: int) -> None:
        key = self._owner.get(id(entry.ids))
        if key is None or self._entries.get(key) is not entry:
            return  # evicted meanwhile: nothing to charge
        entry.nbytes += nbytes
        self.bytes += nbytes
        self._evict()

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._entries:
            key, old = self._entries.popitem(last=False)
            self._forget(key, old)
            metrics.DOCUMENT_CACHE_EVICTIONS.inc()
        metrics.DOCUMENT_CACHE_BYTES.set(self.bytes)

    def _forget(self, key: bytes, entry: CachedDocument) -> None:
        self.bytes -= entry.nbytes
        if self._owner.get(id(entry.ids)) == key:
            del self._owner[id(entry.ids)]


def _freeze(*arrays: np.ndarray) -> None:
    for array in arrays:
        array.flags.writeable = False


def _cut(ids: np.ndarray, offsets: np.ndarray, text: str, max_tokens: int | None) -> Encoded:
    """The document as the pipeline sees it: the first ``max_tokens`` tokens (views, no copy)."""
    if max_tokens is not None and ids.shape[0] > max_tokens:
        return Encoded(ids=ids[:max_tokens], offsets=offsets[:max_tokens], text=text, truncated=True, full_length=int(ids.shape[0]))
    return Encoded(ids=ids, offsets=offsets, text=text)
