"""Stage 1: tokenize the query and the documents once, with character offsets.

Everything later (blocks, windows, BM25 terms, model inputs, evidence) is a
view on these arrays; nothing is tokenized twice on the cross-encoder side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


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

    def __init__(self, tokenizer: Tokenizer, *, text_lead: str = "", special_ids: Sequence[int] = ()):
        self._tok = tokenizer
        self._tok.no_truncation()
        self._tok.no_padding()
        self._tok.encode_special_tokens = True
        self.text_lead = text_lead
        """Prepended before encoding (the model's template), cut from the offsets again."""
        self.special_ids = np.asarray(sorted(special_ids), dtype=np.int64)
        """Ids no text may encode to (checked on every batch: a tokenizer that matched one is a bug, not input)."""
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: str | Path, *, text_lead: str = "", special_ids: Sequence[int] = ()) -> TextTokenizer:
        return cls(Tokenizer.from_file(str(path)), text_lead=text_lead, special_ids=special_ids)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode_query(self, query: str, max_tokens: int) -> Encoded:
        """The query, cut to ``max_tokens`` word pieces (the papers use 32)."""
        return self.encode_documents([query], max_tokens=max_tokens)[0]

    def encode_documents(self, texts: Sequence[str], max_tokens: int | None = None) -> list[Encoded]:
        """All texts in one batched call (the Rust side runs them in parallel)."""
        lead = len(self.text_lead)
        encodings = self._tok.encode_batch([self.text_lead + t for t in texts] if lead else list(texts), add_special_tokens=False)
        out = []
        for text, enc in zip(texts, encodings):
            ids = np.asarray(enc.ids, dtype=np.int64)
            offsets = np.asarray(enc.offsets, dtype=np.int32).reshape(-1, 2)
            if lead:
                offsets = np.maximum(offsets - lead, 0)
            if self.special_ids.size:
                # Last line of defence (prepare makes special pieces unreachable from text): a special id
                # that text still produced is dropped, never shown to the model as a separator.
                keep = ~np.isin(ids, self.special_ids)
                if not keep.all():
                    ids, offsets = ids[keep], offsets[keep]
            full_length = int(ids.shape[0])
            truncated = max_tokens is not None and full_length > max_tokens
            if truncated:
                ids, offsets = ids[:max_tokens], offsets[:max_tokens]
            out.append(Encoded(ids=ids, offsets=offsets, text=text, truncated=truncated, full_length=full_length if truncated else None))
        return out
