"""Stage 1: the ids and offsets keyrank computes for plain-ASCII text (without the normalizer, offsets from the
ids) equal the tokenizer's own, and every other text still gets the tokenizer's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keyrank.tokenize import _PLAIN, TextTokenizer
from shared_data import CE_MODEL
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

TOKENIZER = TextTokenizer.from_file(CE_MODEL / "tokenizer.json")
REFERENCE = Tokenizer.from_file(str(CE_MODEL / "tokenizer.json"))
REFERENCE.encode_special_tokens = True

pieces = st.sampled_from(["the", "Meeting", "decided", "UNaffordable", "##ing", "#", "[SEP]", "[cls]", "e.g.", "3.5%",
                          "don't", "(remote)", "x" * 101, "~`|", "a-b_c", "", "Z"])
spaces = st.sampled_from([" ", "  ", "\n", "\r\n", "\t", "", " \n\n "])
ascii_texts = st.lists(st.tuples(pieces, spaces), max_size=40).map(lambda parts: "".join(p + s for p, s in parts))


def _reference(text: str) -> tuple[np.ndarray, np.ndarray]:
    enc = REFERENCE.encode(text, add_special_tokens=False)
    return np.asarray(enc.ids, dtype=np.int64), np.asarray(enc.offsets, dtype=np.int32).reshape(-1, 2)


def _fast(texts: list[str]) -> list[bool]:
    """Which of ``texts`` ``encode_documents`` read on the fast path (ids without the normalizer, offsets computed)."""
    seen, original = [], TOKENIZER._plain_pieces

    def recording(raw, token_ids):
        result = original(raw, token_ids)
        seen.append((raw.tobytes().decode("ascii"), result is not None))
        return result

    TOKENIZER._plain_pieces = recording
    try:
        TOKENIZER.encode_documents(texts)
    finally:
        del TOKENIZER._plain_pieces
    taken = dict(seen)
    return [taken.get(t, False) for t in texts]


def _assert_same(texts: list[str], tokenizer: TextTokenizer = TOKENIZER) -> None:
    for text, enc in zip(texts, tokenizer.encode_documents(texts), strict=True):
        ids, offsets = _reference(text)
        assert enc.text == text
        assert np.array_equal(enc.ids, ids), text
        assert np.array_equal(enc.offsets, offsets), text


@settings(max_examples=150, deadline=None)
@given(st.lists(ascii_texts, min_size=1, max_size=6))
def test_ascii_offsets_equal_the_tokenizers_own(texts):
    _assert_same(texts)
    for text, fast in zip(texts, _fast(texts)):  # and they came from the fast path, unless a word was [UNK]
        assert fast == ("x" * 101 not in text), text


def test_text_the_fast_path_cannot_read_exactly_gets_the_tokenizers_offsets():
    texts = ["naïve café", "a\x01b c", "del\x7f here", "x" * 120 + " word", "plain text", "", "“quoted” — dash",
             "emoji 🙂 ok", "tab\tand\x0bvertical tab"]
    _assert_same(texts)
    assert _fast(texts) == [False, False, False, False, True, True, False, False, False]
    # In a batch, texts of both paths keep their order.
    assert [e.text for e in TOKENIZER.encode_documents(texts)] == texts


def test_a_cut_and_the_query_cap_apply_on_the_fast_path():
    text = "one two three four five six seven"
    (enc,) = TOKENIZER.encode_documents([text], max_tokens=3)
    assert enc.truncated and enc.full_length == 7 and len(enc) == 3
    assert text[slice(*enc.char_span(0, 3))] == "one two three"


@pytest.fixture(scope="module")
def bpe_tokenizer():
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["the meeting decided the budget"] * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"],
                                                                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def test_a_tokenizer_other_than_berts_wordpiece_keeps_its_own_offsets(bpe_tokenizer):
    tokenizer = TextTokenizer(bpe_tokenizer)
    assert tokenizer._plain_tok is None
    (enc,) = tokenizer.encode_documents(["the meeting decided"])
    expected = bpe_tokenizer.encode("the meeting decided", add_special_tokens=False)
    assert np.array_equal(enc.offsets, np.asarray(expected.offsets).reshape(-1, 2))


def test_a_template_lead_keeps_the_tokenizers_offsets():
    tokenizer = TextTokenizer.from_file(CE_MODEL / "tokenizer.json", text_lead=": ")
    assert tokenizer._plain_tok is None
    (enc,) = tokenizer.encode_documents(["budget review"])
    assert enc.text[slice(*enc.char_span(0, len(enc)))] == "budget review"
