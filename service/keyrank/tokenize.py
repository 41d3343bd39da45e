"""Stage 1: tokenize the query and the documents once, with character offsets.

Everything later (blocks, windows, BM25 terms, model inputs, evidence) is a
view on these arrays; nothing is tokenized twice on the cross-encoder side.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from keyrank.cores import usable_cores

_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[[9, 10, 13, 32]] = True
"""The ASCII bytes BERT's pre-tokenizer splits on and no token covers."""
_PLAIN = _WHITESPACE.copy()
_PLAIN[32:127] = True
"""ASCII bytes BERT's normalizer keeps one for one (control bytes besides tab and newlines it deletes)."""
WORD_CACHE_CHUNKS = 50_000
"""Distinct chunks (whitespace-separated words) ``WordPieces`` keeps (~20 MB at most); past that it starts again. 100
QMSum meetings hold ~5,000."""
WORD_CACHE_CORES = 6
"""``tokenize_word_cache=auto`` takes the word cache below this many cores per worker process: its ids cost 0.18x
the CPU time of the Rust encoding but on one thread, so the two break even at ~5.6 threads for the Rust batch at
best (docs/PERFORMANCE.md, section 2)."""


@dataclass(frozen=True, slots=True)
class Encoded:
    """One text as word pieces, without special tokens."""

    ids: np.ndarray
    """int64 [n] token ids."""
    offsets: np.ndarray
    """int32 [n, 2] character [start, end) of each token in ``text``."""
    text: str
    """The caller's text, unchanged: offsets slice it."""
    truncated: bool = False
    """True when tokens past a limit were dropped."""
    full_length: int | None = None
    """Tokens of the whole text before any cut (None: nothing was cut, ``len(ids)``)."""

    @property
    def total_tokens(self) -> int:
        """Tokens the whole text has, read or not (coverage: a result reads some of them)."""
        return len(self) if self.full_length is None else self.full_length

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def char_span(self, start: int, end: int) -> tuple[int, int]:
        """Character [start, end) covered by tokens [start, end)."""
        return int(self.offsets[start, 0]), int(self.offsets[end - 1, 1])


class TextTokenizer:
    """The cross-encoder's tokenizer (HF ``tokenizers``), batched, offsets kept.

    Special tokens typed into a query or a document are encoded as the plain text they are
    (``encode_special_tokens``): ``a [SEP] b`` gives ``[``, ``sep``, ``]``, never the separator id.
    """

    def __init__(self, tokenizer: Tokenizer, *, text_lead: str = "", special_ids: Sequence[int] = (), word_cache: bool = True):
        self._tok = tokenizer
        self._tok.no_truncation()
        self._tok.no_padding()
        self._tok.encode_special_tokens = True
        self.text_lead = text_lead
        """Prepended before encoding (the model's template), cut from the offsets again."""
        self.special_ids = np.asarray(sorted(special_ids), dtype=np.int64)
        """Ids no text may encode to (checked on every batch: a tokenizer that matched one is a bug, not input)."""
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._is_special = np.zeros(max(self.vocab_size, int(self.special_ids.max(initial=-1)) + 1), dtype=bool)
        self._is_special[self.special_ids] = True
        self._piece_chars = _wordpiece_lengths(self._tok) if not text_lead else None
        """Characters each id covers, where plain-ASCII offsets can be computed here (None: never)."""
        self._plain_tok, self._lowercase = None, False
        if self._piece_chars is not None:
            # The same tokenizer without its normalizer, for plain ASCII (see _plain_pieces).
            self._plain_tok = Tokenizer.from_str(self._tok.to_str())
            self._plain_tok.normalizer = None
            self._plain_tok.encode_special_tokens = True
            self._lowercase = bool(self._tok.normalizer.lowercase)
        self.words = WordPieces(self._plain_tok.model) if self._plain_tok is not None and word_cache else None
        """Plain-ASCII texts split here at whitespace, each distinct chunk's pieces cached (None: the Rust batch)."""

    @classmethod
    def from_file(cls, path: str | Path, *, text_lead: str = "", special_ids: Sequence[int] = (), word_cache: bool = True) -> TextTokenizer:
        return cls(Tokenizer.from_file(str(path)), text_lead=text_lead, special_ids=special_ids, word_cache=word_cache)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode_query(self, query: str, max_tokens: int) -> Encoded:
        """The query, cut to ``max_tokens`` word pieces (the papers use 32)."""
        return self.encode_documents([query], max_tokens=max_tokens)[0]

    def encode_documents(self, texts: Sequence[str], max_tokens: int | None = None) -> list[Encoded]:
        """All texts in one batched call (the Rust side runs them in parallel)."""
        texts = list(texts)
        pieces: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(texts)
        if self._plain_tok is not None:
            raw = {i: np.frombuffer(t.encode("ascii"), dtype=np.uint8) for i, t in enumerate(texts) if t.isascii()}
            plain = [i for i, r in raw.items() if _PLAIN[r].all()]
            lowered = [texts[i].lower() if self._lowercase else texts[i] for i in plain]
            if self.words is not None:
                ids = [self.words.encode(text) for text in lowered]
            else:
                ids = [enc.ids for enc in self._plain_tok.encode_batch_fast(lowered, add_special_tokens=False)]
            for i, token_ids in zip(plain, ids):
                pieces[i] = self._plain_pieces(raw[i], token_ids)
        rest = [i for i, p in enumerate(pieces) if p is None]
        lead = len(self.text_lead)
        for i, enc in zip(rest, self._tok.encode_batch([self.text_lead + texts[i] for i in rest], add_special_tokens=False)):
            offsets = np.asarray(enc.offsets, dtype=np.int32).reshape(-1, 2)
            pieces[i] = np.asarray(enc.ids, dtype=np.int64), np.maximum(offsets - lead, 0) if lead else offsets
        return [self._encoded(text, ids, offsets, max_tokens) for text, (ids, offsets) in zip(texts, pieces)]

    def _plain_pieces(self, raw: np.ndarray, token_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """Ids and offsets of a plain-ASCII text (``raw``, its bytes: printable, tab and newlines only) from ids the
        tokenizer gave without its normalizer and without offsets, or None where they are not exact.

        On such text BERT's normalizer only lowercases (it turns tab and newlines into spaces, which the
        pre-tokenizer splits on anyway; there is nothing to clean, strip or space out), so lowercasing first and
        skipping it gives the same ids: a third of the Rust time saved. And the pieces, ``##`` cut, spell the
        text's non-whitespace characters in order, so piece lengths laid over those characters are the offsets:
        building 2n Python ints and reading them back into numpy, single-threaded, was another third of the
        tokenize stage (docs/PERFORMANCE.md, section 2). Not exact where a piece is [UNK] (a word over 100
        characters): that text goes through the tokenizer's own offsets."""
        ids = np.asarray(token_ids, dtype=np.int64)
        chars = np.flatnonzero(~_WHITESPACE[raw]).astype(np.int32)
        lengths = self._piece_chars[ids]
        ends = np.cumsum(lengths, dtype=np.int64)
        if (ends[-1] if ends.size else 0) != chars.size or (lengths <= 0).any():
            return None
        offsets = np.empty((ids.size, 2), dtype=np.int32)
        offsets[:, 0] = chars[ends - lengths]
        offsets[:, 1] = chars[ends - 1] + 1
        return ids, offsets

    def _encoded(self, text: str, ids: np.ndarray, offsets: np.ndarray, max_tokens: int | None) -> Encoded:
        if self.special_ids.size:
            # Last line of defence (prepare makes special pieces unreachable from text): a special id
            # that text still produced is dropped, never shown to the model as a separator.
            keep = ~self._is_special[ids]
            if not keep.all():
                ids, offsets = ids[keep], offsets[keep]
        full_length = int(ids.shape[0])
        truncated = max_tokens is not None and full_length > max_tokens
        if truncated:
            ids, offsets = ids[:max_tokens], offsets[:max_tokens]
        return Encoded(ids=ids, offsets=offsets, text=text, truncated=truncated, full_length=full_length if truncated else None)


class WordPieces:
    """The ids of plain-ASCII text (as the tokenizer without its normalizer gives them), word by word.

    On such text BERT's pre-tokenizer splits on whitespace and makes every other non-alphanumeric character a
    word of its own (``_WORD``); WordPiece then reads each word alone. So the ids of a whitespace-separated chunk
    never depend on its neighbours, and text repeats its chunks (100 meetings of ~2k tokens: ~150k chunks, ~5k
    distinct): each distinct chunk goes through the tokenizer's own WordPiece model once, later ones are a dict
    lookup. 0.18x the CPU time of the batched Rust encoding, on the caller's one thread (docs/PERFORMANCE.md,
    section 2). Thread-safe (one dict, read and written under the GIL)."""

    _WORD = re.compile(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]")
    LONGEST = 64
    """Characters of the longest chunk kept (a longer one, a URL or a blob, is split each time it comes)."""

    def __init__(self, model: models.Model, capacity: int = WORD_CACHE_CHUNKS):
        self._model = model
        self.capacity = capacity
        self._pieces: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self._pieces)

    def encode(self, text: str) -> np.ndarray:
        """int64 ids of ``text`` (ASCII, already lowercased where the model lowercases)."""
        get, miss = self._pieces.get, self._miss
        found = [get(chunk) or miss(chunk) for chunk in text.split()]
        return np.fromiter(itertools.chain.from_iterable(found), dtype=np.int64)

    def _miss(self, chunk: str) -> list[int]:
        pieces = [token.id for word in self._WORD.findall(chunk) for token in self._model.tokenize(word)]
        if len(chunk) <= self.LONGEST:
            if len(self._pieces) >= self.capacity:
                self._pieces = {}
            self._pieces[chunk] = pieces
        return pieces


def word_cache_pays(workers: int = 1) -> bool:
    """The word cache is the cheaper way on this machine: fewer than ``WORD_CACHE_CORES`` usable cores per worker
    process for the Rust encoding to spread a request over (``RAYON_NUM_THREADS`` caps them where set)."""
    cores = usable_cores() / max(workers, 1)
    rayon = os.environ.get("RAYON_NUM_THREADS", "")
    if rayon.isdigit() and int(rayon) > 0:
        cores = min(cores, int(rayon))
    return cores < WORD_CACHE_CORES


def _wordpiece_lengths(tok: Tokenizer) -> np.ndarray | None:
    """int64 [vocab]: characters of text each id covers (0 for special tokens and [UNK]), for a BERT WordPiece
    tokenizer whose added tokens are all special; None for any other tokenizer (its offsets come from it)."""
    if not (isinstance(tok.model, models.WordPiece) and isinstance(tok.normalizer, normalizers.BertNormalizer)
            and isinstance(tok.pre_tokenizer, pre_tokenizers.BertPreTokenizer)):
        return None
    added = tok.get_added_tokens_decoder()
    if not all(token.special for token in added.values()):
        return None
    prefix = tok.model.continuing_subword_prefix
    lengths = np.zeros(tok.get_vocab_size(with_added_tokens=True), dtype=np.int64)
    for piece, token_id in tok.get_vocab(with_added_tokens=False).items():
        if token_id not in added:
            lengths[token_id] = len(piece) - len(prefix) if piece.startswith(prefix) and piece != prefix else len(piece)
    return lengths
