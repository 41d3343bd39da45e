"""Stage 1: the ids and offsets keyrank computes for plain-ASCII text (without the normalizer, offsets from the
ids; the ids word by word from a cache, or from the Rust batch) equal the tokenizer's own, and every other text
still gets the tokenizer's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keyrank import tokenize
from keyrank.config import Settings
from keyrank.pipeline import Pipeline
from keyrank.tokenize import TextTokenizer
from shared_data import CE_MODEL
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

TOKENIZER = TextTokenizer.from_file(CE_MODEL / "tokenizer.json")
RUST = TextTokenizer.from_file(CE_MODEL / "tokenizer.json", word_cache=False)
REFERENCE = Tokenizer.from_file(str(CE_MODEL / "tokenizer.json"))
REFERENCE.encode_special_tokens = True

pieces = st.sampled_from(["the", "Meeting", "decided", "UNaffordable", "##ing", "#", "[SEP]", "[cls]", "e.g.", "3.5%",
                          "don't", "(remote)", "x" * 101, "~`|", "a-b_c", "", "Z", "mp3player2026", "{vocalsound}", "\\n"])
spaces = st.sampled_from([" ", "  ", "\n", "\r\n", "\t", "", " \n\n "])
ascii_texts = st.lists(st.tuples(pieces, spaces), max_size=40).map(lambda parts: "".join(p + s for p, s in parts))


def _reference(text: str) -> tuple[np.ndarray, np.ndarray]:
    enc = REFERENCE.encode(text, add_special_tokens=False)
    return np.asarray(enc.ids, dtype=np.int64), np.asarray(enc.offsets, dtype=np.int32).reshape(-1, 2)


def _fast(texts: list[str], tokenizer: TextTokenizer = TOKENIZER) -> list[bool]:
    """Which of ``texts`` ``encode_documents`` read on the fast path (ids without the normalizer, offsets computed)."""
    seen, original = [], tokenizer._plain_pieces

    def recording(raw, token_ids):
        result = original(raw, token_ids)
        seen.append((raw.tobytes().decode("ascii"), result is not None))
        return result

    tokenizer._plain_pieces = recording
    try:
        tokenizer.encode_documents(texts)
    finally:
        del tokenizer._plain_pieces
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
    for tokenizer in (TOKENIZER, RUST):  # ids from the word cache, and from the Rust batch
        _assert_same(texts, tokenizer)
        for text, fast in zip(texts, _fast(texts, tokenizer)):  # and they came from the fast path, unless a word was [UNK]
            assert fast == ("x" * 101 not in text), text


def test_the_word_cache_gives_the_same_ids_when_it_starts_again_and_keeps_no_long_chunk():
    words = TextTokenizer.from_file(CE_MODEL / "tokenizer.json")
    words.words.capacity = 3  # restarts every few distinct chunks
    long = "-".join(["remote"] * 20)  # 139 characters without a space: split each time, never kept
    texts = ["the budget meeting decided the budget, again: 3.5% of (remote) budgets", "unaffordable remote-controls", long] * 2
    _assert_same(texts, words)
    assert _fast(texts, words) == [True] * len(texts)
    assert 0 < len(words.words) <= 3
    words.words.capacity = 1000
    words.encode_documents(texts)
    assert "budget," in words.words._pieces and long not in words.words._pieces
    assert TOKENIZER.words is not None and RUST.words is None


def test_a_cased_wordpiece_reads_capitals_as_they_are():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "The", "Meet", "##ing", "AB", "##C", "def", "x", "Y", "z", ",", "-", "2", "##6"]
    cased = Tokenizer(models.WordPiece({piece: i for i, piece in enumerate(vocab)}, unk_token="[UNK]"))
    cased.normalizer = normalizers.BertNormalizer(lowercase=False)
    cased.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cased.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    reference = Tokenizer.from_str(cased.to_str())
    reference.encode_special_tokens = True
    tokenizer = TextTokenizer(cased)
    assert tokenizer.words is not None and not tokenizer._lowercase
    texts = ["The Meeting,  ABC-def", "x Y z\n26", "the ABC the"]
    assert _fast(texts, tokenizer) == [True, True, True]
    for text, enc in zip(texts, tokenizer.encode_documents(texts)):
        expected = reference.encode(text, add_special_tokens=False)
        assert enc.ids.tolist() == expected.ids and enc.offsets.tolist() == [list(o) for o in expected.offsets], text


@pytest.mark.parametrize(("cores", "workers", "rayon", "pays"), [
    (2, 1, None, True), (5, 1, None, True), (6, 1, None, False), (16, 1, None, False), (16, 2, None, False),
    (16, 4, None, True), (16, 1, "2", True), (16, 1, "8", False), (2, 1, "8", True), (16, 1, "0", False),
])
def test_auto_takes_the_word_cache_below_six_cores_per_worker(machine, monkeypatch, cores, workers, rayon, pays):
    machine(cores)
    if rayon is not None:
        monkeypatch.setenv("RAYON_NUM_THREADS", rayon)
    assert tokenize.word_cache_pays(workers) is pays


def test_a_two_core_container_on_a_big_machine_takes_the_word_cache(machine):
    machine(64, "200000 100000")
    assert tokenize.word_cache_pays(1)
    machine(64, "max 100000")
    assert not tokenize.word_cache_pays(1)


@pytest.mark.parametrize(("choice", "cores", "expected"), [("on", 16, True), ("off", 2, False), ("auto", 2, True), ("auto", 16, False)])
def test_the_setting_picks_the_way(prepared_models, machine, choice, cores, expected):
    machine(cores)
    pipeline = Pipeline.from_model_dir(Settings(model_dir=prepared_models, tokenize_word_cache=choice))
    assert (pipeline.tokenizer.words is not None) is expected


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


def test_threads_sharing_one_word_cache_get_the_ids_one_thread_gets():
    from concurrent.futures import ThreadPoolExecutor

    shared = TextTokenizer.from_file(CE_MODEL / "tokenizer.json")
    shared.words.capacity = 50  # restarts while the threads read and write it
    rng = np.random.default_rng(7)
    words = ["budget", "remote", "control", "meeting,", "(agreed)", "3.5%", "unaffordable", "x-y_z", "Twelve", "euros."]
    texts = [" ".join(rng.choice(words, 300)) + f" w{i}" * 20 for i in range(24)]
    expected = [e.ids for e in RUST.encode_documents(texts)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda t: shared.encode_documents([t])[0].ids, texts * 3))
    for ids, want in zip(got, expected * 3):
        np.testing.assert_array_equal(ids, want)
