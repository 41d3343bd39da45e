"""The tiny family checkpoints (tests/families.py) are real Hugging Face checkpoints: the Auto
classes load them, each tokenizer lays out a query/passage pair the way its family's real
rerankers do, and each model scores that pair with a finite logit."""

from __future__ import annotations

import json

import pytest
import torch
from families import DECODER_FAMILIES, FAMILIES, MAX_LENGTH, build_family, family_checkpoint

QUERY = "what is a cat"
PASSAGE = "a cat is an animal"

# Per family: (tokenizer class after AutoTokenizer, pair template as tokens, token types or None for
# none returned). "Q"/"P" stand for the query's and the passage's own pieces.
LAYOUT = {
    "bert": ("BertTokenizer", ["[CLS]", "Q", "[SEP]", "P", "[SEP]"], (0, 1)),
    "electra": ("BertTokenizer", ["[CLS]", "Q", "[SEP]", "P", "[SEP]"], (0, 1)),
    "xlm-roberta": ("XLMRobertaTokenizer", ["<s>", "Q", "</s>", "</s>", "P", "</s>"], None),
    "roberta": ("RobertaTokenizer", ["<s>", "Q", "</s>", "</s>", "P", "</s>"], None),
    "deberta-v2": ("DebertaV2Tokenizer", ["[CLS]", "Q", "[SEP]", "P", "[SEP]"], (0, 1)),
    "modernbert": ("TokenizersBackend", ["[CLS]", "Q", "[SEP]", "P", "[SEP]"], None),
    # A decoder reranker formats its own prompt as text: the tokenizer adds nothing to a pair.
    "qwen3": ("Qwen2Tokenizer", ["Q", "P"], None),
}
ARCHITECTURE = {
    "bert": "BertForSequenceClassification",
    "electra": "ElectraForSequenceClassification",
    "xlm-roberta": "XLMRobertaForSequenceClassification",
    "roberta": "RobertaForSequenceClassification",
    "deberta-v2": "DebertaV2ForSequenceClassification",
    "modernbert": "ModernBertForSequenceClassification",
    "qwen3": "Qwen3ForCausalLM",
}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(kind, checkpoint folder, tokenizer, model) loaded back through the Auto classes."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    kind = request.param
    path = family_checkpoint(kind, tmp_path_factory)
    auto = AutoModelForCausalLM if kind in DECODER_FAMILIES else AutoModelForSequenceClassification
    return kind, path, AutoTokenizer.from_pretrained(path), auto.from_pretrained(path).eval()


def _pieces(tokenizer, text: str) -> list[str]:
    return tokenizer.convert_ids_to_tokens(tokenizer(text, add_special_tokens=False).input_ids)


def test_auto_classes_load_the_family_tokenizer_and_architecture(family):
    kind, path, tokenizer, model = family
    assert type(tokenizer).__name__ == LAYOUT[kind][0]
    assert type(model).__name__ == ARCHITECTURE[kind]
    assert model.dtype == torch.float32
    # Every id the tokenizer can emit has an embedding row.
    assert len(tokenizer) <= model.config.vocab_size
    assert tokenizer.model_max_length == MAX_LENGTH
    if kind not in DECODER_FAMILIES:
        assert model.config.num_labels == 1
    assert json.loads((path / "config.json").read_text())["architectures"] == [ARCHITECTURE[kind]]


def test_pair_encoding_follows_the_family_template(family):
    kind, _, tokenizer, _ = family
    _, template, types = LAYOUT[kind]
    query, passage = _pieces(tokenizer, QUERY), _pieces(tokenizer, PASSAGE)
    expected = [t for slot in template for t in {"Q": query, "P": passage}.get(slot, [slot])]

    encoded = tokenizer(QUERY, PASSAGE)
    assert tokenizer.convert_ids_to_tokens(encoded.input_ids) == expected
    if types is None:
        assert "token_type_ids" not in encoded
    else:
        # Segment A is the query and its [CLS]/[SEP]; segment B the passage and the final [SEP].
        first = template.index("P")
        n_a = len([t for slot in template[:first] for t in {"Q": query}.get(slot, [slot])])
        assert encoded.token_type_ids == [types[0]] * n_a + [types[1]] * (len(expected) - n_a)


def test_english_text_becomes_real_pieces_not_unknown(family):
    _, _, tokenizer, _ = family
    ids = tokenizer(QUERY, PASSAGE, add_special_tokens=False).input_ids
    special = set(tokenizer.all_special_ids)
    assert ids and not special & set(ids)
    # Common words are whole pieces (the tokenizer was trained on English, not just characters).
    assert any(piece.lstrip("▁Ġ") == "cat" for piece in _pieces(tokenizer, PASSAGE))


def test_model_scores_the_pair_with_a_finite_logit(family):
    kind, _, tokenizer, model = family
    encoded = tokenizer(QUERY, PASSAGE, return_tensors="pt")
    with torch.no_grad():
        logits = model(**encoded).logits
    if kind in DECODER_FAMILIES:
        yes, no = tokenizer.convert_tokens_to_ids(["yes", "no"])
        last = logits[0, -1]
        assert logits.shape[:2] == encoded.input_ids.shape
        assert torch.isfinite(last[yes] - last[no])
    else:
        assert logits.shape == (1, 1)
        assert torch.isfinite(logits).all()


def test_qwen3_answers_yes_and_no_are_single_distinct_tokens(tmp_path_factory):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(family_checkpoint("qwen3", tmp_path_factory))
    yes, no = tokenizer.convert_tokens_to_ids(["yes", "no"])
    assert yes != no
    assert tokenizer.unk_token_id not in (yes, no) and None not in (yes, no)
    # The prompt's answer position reads the bare words: they encode to exactly those ids.
    assert tokenizer("yes", add_special_tokens=False).input_ids == [yes]
    assert tokenizer("no", add_special_tokens=False).input_ids == [no]
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= set(tokenizer.all_special_tokens)
    assert tokenizer.pad_token == "<|endoftext|>"


def test_build_is_seeded_so_two_builds_are_identical(tmp_path):
    for kind in ("bert", "deberta-v2"):
        a, b = build_family(kind, tmp_path / f"{kind}-a"), build_family(kind, tmp_path / f"{kind}-b")
        for name in ("model.safetensors", "tokenizer.json", "config.json"):
            assert (a / name).read_bytes() == (b / name).read_bytes(), (kind, name)


def test_unknown_family_is_refused_with_the_known_names(tmp_path):
    with pytest.raises(ValueError, match="xlm-roberta"):
        build_family("gpt-5", tmp_path)
