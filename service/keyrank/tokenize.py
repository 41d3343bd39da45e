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

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def char_span(self, start: int, end: int) -> tuple[int, int]:
        """Character [start, end) covered by tokens [start, end)."""
        return int(self.offsets[start, 0]), int(self.offsets[end - 1, 1])


class TextTokenizer:
    """The cross-encoder's tokenizer (HF ``tokenizers``), batched, offsets kept."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._tok.no_truncation()
        self._tok.no_padding()
        self.cls_id = self._special_id("[CLS]", "<s>")
        self.sep_id = self._special_id("[SEP]", "</s>")
        self.pad_id = self._special_id("[PAD]", "<pad>")
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: str | Path) -> TextTokenizer:
        return cls(Tokenizer.from_file(str(path)))

    def _special_id(self, *names: str) -> int:
        for name in names:
            token_id = self._tok.token_to_id(name)
            if token_id is not None:
                return int(token_id)
        raise ValueError(f"tokenizer has none of the special tokens {names}")

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode_query(self, query: str, max_tokens: int) -> Encoded:
        """The query, cut to ``max_tokens`` word pieces (the papers use 32)."""
        return self.encode_documents([query], max_tokens=max_tokens)[0]

    def encode_documents(self, texts: Sequence[str], max_tokens: int | None = None) -> list[Encoded]:
        """All texts in one batched call (the Rust side runs them in parallel)."""
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        out = []
        for text, enc in zip(texts, encodings):
            ids = np.asarray(enc.ids, dtype=np.int64)
            offsets = np.asarray(enc.offsets, dtype=np.int32).reshape(-1, 2)
            truncated = max_tokens is not None and ids.shape[0] > max_tokens
            if truncated:
                ids, offsets = ids[:max_tokens], offsets[:max_tokens]
            out.append(Encoded(ids=ids, offsets=offsets, text=text, truncated=truncated))
        return out
