"""The model owns its input: special tokens, separators, token types, length, prompt.

Every reranker family frames a (query, document) pair its own way:

| family                                  | model input                                   | token types |
|-----------------------------------------|-----------------------------------------------|-------------|
| BERT, ELECTRA, MiniLM, DeBERTa-v2/v3    | ``[CLS] q [SEP] d [SEP]``                     | 0 ... 1     |
| RoBERTa, XLM-R (bge-reranker, jina-v2)  | ``<s> q </s></s> d </s>``                     | none        |
| ModernBERT (gte-reranker-modernbert)    | ``[CLS] q [SEP] d [SEP]``                     | none        |
| decoder yes/no (Qwen3-Reranker style)   | chat prompt ... q ... d ... assistant turn    | none; score = logit(yes) - logit(no) of the last token |

``keyrank prepare`` derives the frame from the model's own tokenizer (its pair
post-processor, or the decoder prompt; prepare/template.py) and stores it in the
manifest; this module is the runtime half: the pipeline only asks "how many document tokens fit next to this query" and
"build the input for the query and these document token ranges". Query and
document text are encoded separately (as every pair tokenizer does) and never
as special tokens (tokenize.py), so text cannot forge a separator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

DECODER_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "gemma3_text", "phi3"})
"""HF ``model_type`` of causal LMs scored as yes/no rerankers."""
ROLE_QUERY = 1
"""``InputTemplate.roles``: a query token."""
ROLE_DOCUMENT = 2
"""``InputTemplate.roles``: a document token."""

@dataclass(frozen=True, slots=True)
class InputTemplate:
    """How one model reads a (query, document token ranges) pair."""

    family: str
    """``bert``, ``roberta``, ``deberta``, ``modernbert`` or ``decoder``."""
    max_length: int
    """Longest input the model reads, every frame token included."""
    prefix: tuple[int, ...]
    """Ids before the query (``[CLS]``; a decoder's system prompt up to ``<Query>:``)."""
    middle: tuple[int, ...]
    """Ids between query and document (``[SEP]``; ``</s></s>``; ``\\n<Document>:``)."""
    suffix: tuple[int, ...]
    """Ids after the document (``[SEP]``; the decoder's assistant turn)."""
    prefix_types: tuple[int, ...] = ()
    """Token types of ``prefix`` (empty = all 0)."""
    middle_types: tuple[int, ...] = ()
    """Token types of ``middle`` (empty = all 0)."""
    suffix_types: tuple[int, ...] = ()
    """Token types of ``suffix`` (empty = all 0)."""
    query_type: int = 0
    """Token type of every query token."""
    document_type: int = 0
    """Token type of every document token (1 for BERT-style pairs)."""
    uses_token_types: bool = False
    """Whether the model reads token types at all (else zeros are sent and ignored)."""
    pad_id: int = 0
    """Written after each sequence up to its length bucket (the mask hides it)."""
    text_lead: str = ""
    """Prepended to query and document text before encoding (byte-level BPE prompts end in ``:``,
    the text then starts with its space as it would inside the prompt); offsets still slice the caller's text."""
    special_ids: tuple[int, ...] = ()
    """Every special or added token id but the unknown token's: text must never encode to one of them."""
    yes_no: tuple[int, int] | None = None
    """Decoder rerankers: the ids of ``yes`` and ``no`` (score = logit(yes) - logit(no))."""
    notes: dict = field(default_factory=dict)
    """How the template was derived (tokenizer class, prompt), for the manifest reader."""

    @property
    def frame_tokens(self) -> int:
        """Tokens the template adds around query and document."""
        return len(self.prefix) + len(self.middle) + len(self.suffix)

    def document_budget(self, query_tokens: int, max_length: int | None = None) -> int:
        """Document tokens that fit next to ``query_tokens`` (512 - 3 - q for BERT)."""
        limit = min(self.max_length, max_length) if max_length else self.max_length
        return max(1, limit - self.frame_tokens - query_tokens)

    def build(
        self, query_ids: np.ndarray, doc_ids: np.ndarray, starts: Sequence[int], ends: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Model ids and token types for the query and the document ranges [starts[i], ends[i])."""
        ids, types, _ = self.build_all(query_ids, [(doc_ids, starts, ends)])
        return ids[0], types[0]

    def build_all(self, query_ids: np.ndarray, ranges: Sequence[tuple[np.ndarray, Sequence[int], Sequence[int]]]
                  ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """``build`` and ``roles`` for many (document ids, starts, ends) with one query: ids, types and roles of each.
        The frame and the query are laid out once, not once per sequence (a request has hundreds)."""
        q = query_ids.shape[0]
        head = np.concatenate([np.asarray(self.prefix, np.int64), query_ids, np.asarray(self.middle, np.int64)]).astype(np.int64, copy=False)
        tail = np.asarray(self.suffix, np.int64)
        head_roles = self.roles(q, 0)[: head.shape[0]]
        tail_roles = np.zeros(tail.shape[0], np.int8)
        if self.uses_token_types:
            head_types = np.concatenate([_types(self.prefix_types, len(self.prefix)), np.full(q, self.query_type, np.int64),
                                         _types(self.middle_types, len(self.middle))])
            tail_types, document_type = _types(self.suffix_types, len(self.suffix)), self.document_type
        else:  # zeros are sent and ignored
            head_types, tail_types, document_type = np.zeros(head.shape[0], np.int64), np.zeros(tail.shape[0], np.int64), 0
        ids = [np.concatenate([head, *(doc_ids[s:e] for s, e in zip(starts, ends)), tail]) for doc_ids, starts, ends in ranges]
        # Types and roles are the head's, then one value per document token, then the tail's: cut from one long row.
        longest = max((row.shape[0] for row in ids), default=0)
        body_types = np.concatenate([head_types, np.full(longest, document_type, np.int64)])
        body_roles = np.concatenate([head_roles, np.full(longest, ROLE_DOCUMENT, np.int8)])
        cut = [row.shape[0] - tail.shape[0] for row in ids]
        types = [np.concatenate([body_types[:n], tail_types]) for n in cut]
        roles = [np.concatenate([body_roles[:n], tail_roles]) for n in cut]
        return ids, types, roles

    def roles(self, query_tokens: int, document_tokens: int) -> np.ndarray:
        """int8 [n] what each position of ``build``'s output holds: ``ROLE_QUERY``, ``ROLE_DOCUMENT`` or 0 (frame).

        The interaction graphs (CEDR, Model 1) read it to know which positions are query and document
        tokens, whatever the family's frame."""
        return np.concatenate([
            np.zeros(len(self.prefix), np.int8), np.full(query_tokens, ROLE_QUERY, np.int8),
            np.zeros(len(self.middle), np.int8), np.full(document_tokens, ROLE_DOCUMENT, np.int8),
            np.zeros(len(self.suffix), np.int8),
        ])

    def to_json(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict) -> InputTemplate:
        tuples = {"prefix", "middle", "suffix", "prefix_types", "middle_types", "suffix_types", "special_ids", "yes_no"}
        return cls(**{k: (tuple(v) if k in tuples and v is not None else v) for k, v in data.items()})

    @classmethod
    def bert(cls, cls_id: int, sep_id: int, pad_id: int, max_length: int = 512) -> InputTemplate:
        """``[CLS] q [SEP] d [SEP]`` with token types 0/1 (manifests written before templates existed)."""
        return cls("bert", max_length, (cls_id,), (sep_id,), (sep_id,), (0,), (0,), (1,), 0, 1, True, pad_id,
                   special_ids=(cls_id, sep_id, pad_id))


def _types(stored: tuple[int, ...], n: int) -> np.ndarray:
    return np.asarray(stored, np.int64) if stored else np.zeros(n, np.int64)


# --- derivation at `keyrank prepare` time (duck-typed on a transformers tokenizer) -------------
