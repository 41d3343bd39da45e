"""BM25 over the blocks of a request, on the cross-encoder's word pieces.

Every block is one BM25 "document". Where IDF and the average block length
come from is ``bm25_idf`` (docs/SELECTION.md, "IDF sources"):

- ``document``: the document's own blocks (smoothed as scikit-learn does:
  ln((1 + N) / (1 + df)) + 1, so a term in every block still counts a little);
- ``table``: a ``{token: idf}`` table of the user's collection (``keyrank idf``,
  ``bm25_idf_table``); ``general``: the table shipped with keyrank (idf.py);
  with both, the average block length is the document's own;
- ``request``: all blocks of all candidates of the request (keyrank before
  2026-11-25): a document's score then depends on the other candidates.

The first three give a document the same block scores whatever else is sent.
Defaults k1 = 0.9, b = 0.4 (Anserini). Terms are token ids; punctuation-only
pieces are not terms. Computed for all blocks at once with bincount: no Python
loop over blocks or terms.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from keyrank.segment import Spans
from keyrank.segment import per_document as per_document_split
from keyrank.tokenize import TextTokenizer

if TYPE_CHECKING:
    from keyrank.select import SelectorContext
    from keyrank.tokenize import Encoded


GENERAL_TABLE = Path(__file__).with_name("idf-general.json.gz")
"""The general IDF table shipped with keyrank (package data, built by ``keyrank idf --general``), on the BERT
uncased WordPiece vocabulary of ``ce-minilm-l6`` (MiniLM and most MS MARCO cross-encoders share it)."""


@dataclass(frozen=True, slots=True)
class BlockTerms:
    """The term ids of a set of blocks, flattened."""

    terms: np.ndarray
    """int64 [T] term ids, blocks one after another."""
    block_of: np.ndarray
    """int64 [T] which block each term belongs to."""
    lengths: np.ndarray
    """int64 [B] terms per block (the BM25 document length)."""


def term_mask(tokenizer: TextTokenizer) -> np.ndarray:
    """bool [vocab]: which token ids count as terms (not punctuation, not special)."""
    mask = np.ones(tokenizer.vocab_size, dtype=bool)
    for token_id in range(tokenizer.vocab_size):
        token = tokenizer.id_to_token(token_id) or ""
        piece = token.removeprefix("##")
        if not any(ch.isalnum() for ch in piece) or (token.startswith("[") and token.endswith("]")):
            mask[token_id] = False
    return mask


def document_terms(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, is_term: np.ndarray) -> BlockTerms:
    """The BM25 terms of one document's blocks ``ids[starts[i]:ends[i]]``: the one place terms are extracted
    (the document cache keeps what this returns)."""
    if len(starts) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return BlockTerms(empty, empty, empty)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    block_of = np.repeat(np.arange(len(starts), dtype=np.int64), ends - starts)
    if np.array_equal(starts[1:], ends[:-1]):  # CogLTX blocks tile the document: one slice
        covered = ids[starts[0] : ends[-1]]
    else:
        covered = np.concatenate([ids[a:b] for a, b in zip(starts, ends)])
    keep = is_term[covered]
    block_of = block_of[keep]
    return BlockTerms(terms=covered[keep], block_of=block_of, lengths=np.bincount(block_of, minlength=len(starts)).astype(np.int64))


def joined(parts: Sequence[BlockTerms]) -> BlockTerms:
    """Several documents' ``BlockTerms`` as one, their blocks numbered on from one document to the next."""
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return BlockTerms(empty, empty, empty)
    offsets = np.cumsum([0] + [p.lengths.shape[0] for p in parts[:-1]])
    return BlockTerms(
        terms=np.concatenate([p.terms for p in parts]),
        block_of=np.concatenate([p.block_of + off for p, off in zip(parts, offsets)]),
        lengths=np.concatenate([p.lengths for p in parts]),
    )


def block_terms(token_ids: Sequence[np.ndarray], is_term: np.ndarray) -> BlockTerms:
    """Flatten blocks (each an array of token ids) into terms with their block index."""
    lengths = np.fromiter((len(ids) for ids in token_ids), dtype=np.int64, count=len(token_ids))
    ends = np.cumsum(lengths)
    ids = np.concatenate(token_ids) if token_ids else np.zeros(0, dtype=np.int64)
    return document_terms(ids.astype(np.int64, copy=False), ends - lengths, ends, is_term)


def smoothed_idf(df: np.ndarray, n_blocks: int) -> np.ndarray:
    """scikit-learn's smooth_idf: ln((1 + N) / (1 + df)) + 1."""
    return np.log((1.0 + n_blocks) / (1.0 + df)) + 1.0


class IdfTable:
    """An IDF table ({token: idf}, JSON, gzipped or not): a collection's (``keyrank idf``) or the shipped general one."""

    def __init__(self, table: dict[int, float], default: float):
        self.table = table
        self.default = default

    @classmethod
    def from_json(cls, path: Path, tokenizer: TextTokenizer) -> IdfTable:
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            raw = json.load(f)
        table = {}
        for token, idf in raw.items():
            token_id = tokenizer.token_to_id(token)
            if token_id is not None:
                table[token_id] = float(idf)
        # Terms missing from the table are treated as rare: the table's largest idf.
        return cls(table, default=max(table.values(), default=1.0))

    def lookup(self, term_ids: np.ndarray) -> np.ndarray:
        return np.array([self.table.get(int(t), self.default) for t in term_ids], dtype=np.float64)


def bm25_scores(
    query_terms: np.ndarray,
    blocks: BlockTerms,
    *,
    k1: float = 0.9,
    b: float = 0.4,
    idf_table: IdfTable | None = None,
    per_document: np.ndarray | None = None,
) -> np.ndarray:
    """float64 [B]: BM25 score of every block for the query (query terms counted with multiplicity).

    ``per_document`` (int [D], blocks of each document, in order, summing to B): IDF (unless a table is
    given) and the average block length come from each document's own blocks, so a block's score does not
    depend on the other documents. None: all blocks are one collection (the per-request IDF)."""
    n_blocks = blocks.lengths.shape[0]
    if n_blocks == 0 or query_terms.shape[0] == 0:
        return np.zeros(n_blocks, dtype=np.float64)
    vocab, query_tf = np.unique(query_terms, return_counts=True)
    # Position of each block term in the query vocabulary (or -1), by a lookup table over the ids.
    q = vocab.shape[0]
    lookup = np.full(int(max(blocks.terms.max(initial=0), vocab[-1])) + 1, -1, dtype=np.int64)
    lookup[vocab] = np.arange(q)
    pos = lookup[blocks.terms]
    hit = pos >= 0
    tf = np.bincount(blocks.block_of[hit] * q + pos[hit], minlength=n_blocks * q).reshape(n_blocks, q)
    if per_document is None:
        if idf_table is None:
            idf = smoothed_idf((tf > 0).sum(axis=0), n_blocks)
        else:
            idf = idf_table.lookup(vocab)
        avgdl = max(float(blocks.lengths.mean()), 1e-9)
        norm = k1 * (1.0 - b + b * blocks.lengths / avgdl)
        return _saturate(tf, norm, k1) @ (idf * query_tf)
    counts = np.asarray(per_document, dtype=np.int64)
    doc = np.repeat(np.arange(counts.shape[0]), counts)
    ends = np.cumsum(counts)
    starts = ends - counts  # a document's blocks are the contiguous rows [starts[d], ends[d])
    held = counts > 0  # reduceat runs over the documents that have any blocks
    if idf_table is None:
        df = np.zeros((counts.shape[0], q), dtype=np.int64)  # blocks of each document holding each query term
        if held.any():
            df[held] = np.add.reduceat((tf > 0).astype(np.int64), starts[held], axis=0)
        idf = smoothed_idf(df, counts[:, None])[doc]  # [B, q]: each block its document's IDF
    else:
        idf = idf_table.lookup(vocab)[None, :]
    # Each document's mean block length: integer sums are exact, so the same blocks give the same bits in any request.
    total = np.zeros(counts.shape[0], dtype=np.int64)
    if held.any():
        total[held] = np.add.reduceat(blocks.lengths, starts[held])
    avgdl = np.where(held, np.maximum(total / np.maximum(counts, 1), 1e-9), 1.0)
    norm = k1 * (1.0 - b + b * blocks.lengths / avgdl[doc])
    # Row-wise products and sums (no BLAS): one block's score is computed the same way whatever else is in the call.
    return (_saturate(tf, norm, k1) * (idf * query_tf)).sum(axis=1)


def _saturate(tf: np.ndarray, norm: np.ndarray, k1: float) -> np.ndarray:
    """tf (k1 + 1) / (tf + norm); an empty block with b = 1 has norm 0, its tf is 0 too, and so is its score."""
    denominator = tf + norm[:, None]
    return np.divide(tf * (k1 + 1.0), denominator, out=np.zeros(tf.shape), where=denominator > 0)


class Bm25Selector:
    """The ``bm25`` selector: every block of every document scored against the query's terms, IDF from the
    ``bm25_idf`` source (its table read once, here). The blocks' terms come from the document cache
    (doc_cache.py), extracted by ``terms_of`` with the term mask; they do not depend on the source, so the
    cache serves all."""

    def __init__(self, context: SelectorContext):
        s = context.settings
        self.k1, self.b, self.source = s.bm25_k1, s.bm25_b, s.bm25_idf
        self.is_term = context.is_term
        """bool [vocab]: which token ids count as terms."""
        self.documents = context.documents
        """Where the blocks' terms are kept between requests."""
        self.table = None
        """The IDF table of ``table`` or ``general``; None: IDF from the blocks themselves."""
        if self.source == "table":
            self.table = IdfTable.from_json(s.bm25_idf_table, context.tokenizer)
        elif self.source == "general":
            self.table = general_table(context.tokenizer)

    def score(self, query_text: str, query: Encoded, docs: list[Encoded], pieces: list[Spans]) -> list[np.ndarray]:
        flat = joined(self.documents.block_terms(docs, pieces, self.terms_of))
        query_terms = query.ids[self.is_term[query.ids]]
        per_document = None if self.source == "request" else np.fromiter((len(sp) for sp in pieces), dtype=np.int64, count=len(pieces))
        scores = bm25_scores(query_terms, flat, k1=self.k1, b=self.b, idf_table=self.table, per_document=per_document)
        return per_document_split(scores, pieces)


    def terms_of(self, doc: Encoded, blocks: Spans) -> BlockTerms:
        """The BM25 terms of one document's blocks (what the document cache keeps)."""
        return document_terms(doc.ids, blocks.starts, blocks.ends, self.is_term)


def build(context: SelectorContext) -> Bm25Selector:
    return Bm25Selector(context)


@lru_cache(maxsize=4)
def general_table(tokenizer: TextTokenizer) -> IdfTable:
    """The IDF table shipped with keyrank (``keyrank idf --general``, idf.py), on this tokenizer's ids; read once."""
    return IdfTable.from_json(GENERAL_TABLE, tokenizer)
