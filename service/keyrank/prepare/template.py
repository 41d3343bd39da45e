"""Prepare time: the model's input template, derived from its own tokenizer and config.

Encoders: the pair encoding of two probe pairs is split into prefix, middle and
suffix special tokens (with their token types) around query and document;
decoder yes/no rerankers: the published prompt around them. The result is an
``InputTemplate`` (keyrank/template.py, the runtime half) stored in the manifest.
"""

from __future__ import annotations

from keyrank.errors import KeyrankError
from keyrank.template import DECODER_TYPES, InputTemplate

ENCODER_FAMILIES = {
    "bert": "bert", "electra": "bert", "distilbert": "bert", "mpnet": "roberta",
    "roberta": "roberta", "xlm-roberta": "roberta", "camembert": "roberta",
    "deberta-v2": "deberta", "deberta": "deberta", "modernbert": "modernbert",
}
"""HF ``model_type`` -> template family for sequence-classification rerankers."""
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
