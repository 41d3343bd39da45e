"""The model owns its input: special tokens, separators, token types, length, prompt.

Every reranker family frames a (query, document) pair its own way:

| family                                  | model input                                   | token types |
|-----------------------------------------|-----------------------------------------------|-------------|
| BERT, ELECTRA, MiniLM, DeBERTa-v2/v3    | ``[CLS] q [SEP] d [SEP]``                     | 0 ... 1     |
| RoBERTa, XLM-R (bge-reranker, jina-v2)  | ``<s> q </s></s> d </s>``                     | none        |
| ModernBERT (gte-reranker-modernbert)    | ``[CLS] q [SEP] d [SEP]``                     | none        |
| decoder yes/no (Qwen3-Reranker style)   | chat prompt ... q ... d ... assistant turn    | none; score = logit(yes) - logit(no) of the last token |

``keyrank prepare`` derives the frame from the model's own tokenizer (its pair
post-processor, or the decoder prompt) and stores it in the manifest; the
pipeline then only asks "how many document tokens fit next to this query" and
"build the input for the query and these document token ranges". Query and
document text are encoded separately (as every pair tokenizer does) and never
as special tokens (tokenize.py), so text cannot forge a separator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from keyrank.errors import KeyrankError

ENCODER_FAMILIES = {
    "bert": "bert", "electra": "bert", "distilbert": "bert", "mpnet": "roberta",
    "roberta": "roberta", "xlm-roberta": "roberta", "camembert": "roberta",
    "deberta-v2": "deberta", "deberta": "deberta", "modernbert": "modernbert",
}
"""HF ``model_type`` -> template family for sequence-classification rerankers."""
DECODER_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "gemma3_text", "phi3"})
"""HF ``model_type`` of causal LMs scored as yes/no rerankers."""

QWEN3_RERANKER_PROMPT = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
"""Qwen3-Reranker's published prompt; ``{instruction}`` is filled at prepare time."""
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


class UnsupportedModel(KeyrankError, ValueError):
    """The model's family has no template: raised by ``keyrank prepare``, never at request time."""


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
        parts = [np.asarray(self.prefix, np.int64), query_ids, np.asarray(self.middle, np.int64)]
        parts += [doc_ids[s:e] for s, e in zip(starts, ends)]
        parts.append(np.asarray(self.suffix, np.int64))
        ids = np.concatenate(parts).astype(np.int64, copy=False)
        types = np.zeros(ids.shape[0], dtype=np.int64)
        if self.uses_token_types:
            n_doc = ids.shape[0] - self.frame_tokens - query_ids.shape[0]
            types[:] = np.concatenate([
                _types(self.prefix_types, len(self.prefix)), np.full(query_ids.shape[0], self.query_type),
                _types(self.middle_types, len(self.middle)), np.full(n_doc, self.document_type),
                _types(self.suffix_types, len(self.suffix)),
            ])
        return ids, types

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

_PROBES = (("what is a cat", "a cat is an animal that purrs"), ("who chaired the meeting", "The chair opened it."))


def check_family(config) -> None:
    """Raise ``UnsupportedModel`` naming the family unless a template exists for it."""
    model_type = getattr(config, "model_type", "")
    if model_type not in ENCODER_FAMILIES and model_type not in DECODER_TYPES:
        raise UnsupportedModel(
            f"model family {model_type!r} ({', '.join(getattr(config, 'architectures', None) or ['?'])}) has no input "
            f"template; supported: {', '.join(sorted(ENCODER_FAMILIES))} (cross-encoders) and "
            f"{', '.join(sorted(DECODER_TYPES))} (yes/no decoder rerankers)"
        )


def derive_template(tokenizer, config, *, uses_token_types: bool, max_length: int,
                    instruction: str = DEFAULT_INSTRUCTION) -> InputTemplate:
    """The frame of ``tokenizer``'s own pair encoding (encoders) or of the yes/no prompt (decoders)."""
    check_family(config)
    model_type = config.model_type
    special = _special_ids(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    if model_type in ENCODER_FAMILIES:
        return _encoder_template(tokenizer, ENCODER_FAMILIES[model_type], uses_token_types, max_length, special, pad_id)
    return _decoder_template(tokenizer, max_length, special, pad_id, instruction)


def _special_ids(tokenizer) -> tuple[int, ...]:
    """Special and added tokens, but not the unknown token: unknown characters legitimately map to it."""
    ids = set(tokenizer.all_special_ids)
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    ids.update(int(i) for i in decoder)
    ids.discard(tokenizer.unk_token_id)
    return tuple(sorted(ids))


def _encoder_template(tokenizer, family, uses_token_types, max_length, special, pad_id) -> InputTemplate:
    frames = []
    for query, doc in _PROBES:
        q = tokenizer(query, add_special_tokens=False)["input_ids"]
        d = tokenizer(doc, add_special_tokens=False)["input_ids"]
        pair = tokenizer(query, doc)
        ids, types = pair["input_ids"], pair.get("token_type_ids") or [0] * len(pair["input_ids"])
        frames.append(_split_frame(ids, types, q, d, tokenizer))
    if frames[0] != frames[1]:
        raise UnsupportedModel(f"{type(tokenizer).__name__}: its pair frame changes with the text: {frames}")
    (prefix, middle, suffix), (pt, qt, mt, dt, st) = frames[0]
    return InputTemplate(
        family, max_length, prefix, middle, suffix, pt, mt, st, qt, dt, uses_token_types, int(pad_id),
        special_ids=special, notes={"tokenizer": type(tokenizer).__name__},
    )


def _split_frame(ids, types, q, d, tokenizer):
    """(prefix, middle, suffix) ids and region types of ``prefix + q + middle + d + suffix``."""
    for i in range(len(ids) - len(q) + 1):
        if ids[i : i + len(q)] != q:
            continue
        for j in range(i + len(q), len(ids) - len(d) + 1):
            if ids[j : j + len(d)] == d:
                prefix, middle, suffix = tuple(ids[:i]), tuple(ids[i + len(q) : j]), tuple(ids[j + len(d) :])
                if not set(prefix + middle + suffix) <= set(_special_ids(tokenizer)):
                    continue
                region_types = (tuple(types[:i]), _one(types[i : i + len(q)]), tuple(types[i + len(q) : j]),
                                _one(types[j : j + len(d)]), tuple(types[j + len(d) :]))
                return (prefix, middle, suffix), region_types
    raise UnsupportedModel(f"{type(tokenizer).__name__}: the pair encoding is not [frame] query [frame] document [frame]")


def _one(values) -> int:
    if len(set(values)) > 1:
        raise UnsupportedModel(f"token types vary inside one text: {values}")
    return int(values[0]) if len(values) else 0


def _decoder_template(tokenizer, max_length, special, pad_id, instruction) -> InputTemplate:
    yes, no = (tokenizer.convert_tokens_to_ids(t) for t in ("yes", "no"))
    unk = tokenizer.unk_token_id
    if yes is None or no is None or yes == no or unk in (yes, no):
        raise UnsupportedModel(f"{type(tokenizer).__name__}: 'yes' and 'no' are not single tokens of the vocabulary")
    prompt = QWEN3_RERANKER_PROMPT.replace("{instruction}", instruction)
    before, rest = prompt.split("{query}")
    between, after = rest.split("{document}")

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    # Byte-level BPE glues a word to the space before it: with the prompt ending in ": ", the text is
    # encoded with its leading space ("<Query>:" + " what ..."), which is what encoding the whole prompt gives.
    for lead in (" ", ""):
        b, m = before.removesuffix(lead), between.removesuffix(lead)
        if all(
            encode(prompt.replace("{query}", q).replace("{document}", d))
            == encode(b) + encode(lead + q) + encode(m) + encode(lead + d) + encode(after)
            for q, d in _PROBES
        ):
            return InputTemplate(
                "decoder", max_length, tuple(encode(b)), tuple(encode(m)), tuple(encode(after)),
                pad_id=int(pad_id), text_lead=lead, special_ids=special, yes_no=(int(yes), int(no)),
                notes={"tokenizer": type(tokenizer).__name__, "prompt": prompt},
            )
    raise UnsupportedModel(f"{type(tokenizer).__name__}: the yes/no prompt cannot be split around query and document")
