"""Tiny, seeded Hugging Face checkpoints of every reranker family keyrank supports, built offline.

Each family gets a tokenizer trained here on a small English corpus (so test text becomes real
pieces, not [UNK]), wrapped in the family's own transformers tokenizer class and saved with
`save_pretrained`, plus a 2-layer model of the family's architecture with random weights. That is
enough to pin input templates, special-token handling and ONNX export without a model hub.

    path = build_family("xlm-roberta", tmp / "xlmr")      # a folder AutoTokenizer/AutoModel load
    path = family_checkpoint("qwen3", tmp_path_factory)   # the same, built once per test session
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from shared_data import DATASETS
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

FAMILIES: tuple[str, ...] = ("bert", "electra", "xlm-roberta", "roberta", "deberta-v2", "modernbert", "qwen3")
"""Every family `build_family` knows, in the order docs/GUIDE.md's family table lists them."""

DECODER_FAMILIES: frozenset[str] = frozenset({"qwen3"})
"""Families scored by a causal LM's yes/no logits (load with AutoModelForCausalLM), not a classifier head."""

VOCAB_SIZE = 1000
"""Target size of each trained vocabulary: big enough for whole common words, small enough to train in ms."""

MAX_LENGTH = 512
"""Every family's `model_max_length` and position limit (RoBERTa-likes hold 2 more positions for padding_idx)."""

# Tiny but not degenerate: several heads and layers, so attention masks and layer stacking matter.
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}

# Always in the corpus: the words tests use, decoder answers, digits and punctuation.
SEED_TEXT = (
    "what is a cat",
    "a cat is an animal",
    "A cat is a small domesticated carnivorous mammal with soft fur and retractable claws.",
    "Dogs are loyal animals that people keep as pets; many dogs live in houses with families.",
    "The quick brown fox jumps over the lazy dog.",
    "How do I reset my password? Open the settings page and choose 'Forgot password'.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "Water boils at 100 degrees Celsius (212 F) at sea level.",
    "The meeting on 12 March 2024 discussed the budget, the schedule and the new remote control design.",
    "Photosynthesis converts light energy into chemical energy stored in sugar.",
    "Search engines rank documents by relevance to a query; a reranker scores each query-document pair.",
    "Is the answer yes or no? Answer with yes or no only.",
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided.",
    'Note that the answer can only be "yes" or "no".',
    "user: Given a web search query, retrieve relevant passages that answer the query.",
    "assistant: think about it, then answer.",
    "The price rose by 3.5% to $1,250 - a record; experts said: 'this is unusual!'",
    "0 1 2 3 4 5 6 7 8 9 10 20 50 100 1000 2023 2024 2025",
    "e-mail, self-driving cars, state-of-the-art models & long documents # tags @ names / paths * stars",
    "Who wrote the book? When did the war end? Where is the river? Why is the sky blue?",
)
# Line-initial "yes"/"no" must merge to single tokens for decoder rerankers (Qwen3-Reranker reads them).
ANSWERS = ("yes", "no", "Yes", "No") * 50

# Every printable ASCII character is in each alphabet, so no ASCII text ever maps to the unknown token.
ASCII = [chr(c) for c in range(33, 127)]


@functools.cache
def corpus() -> tuple[str, ...]:
    """Seed text plus ~200 SQuAD contexts spread over its 16 articles (seed only when shared data is absent)."""
    squad = DATASETS / "squad2-dev-half" / "dev-v2.0.json"
    contexts: list[str] = []
    if squad.is_file():
        data = json.loads(squad.read_text(encoding="utf-8"))["data"]
        contexts = [p["context"] for article in data for p in article["paragraphs"]][::3]
    return SEED_TEXT * 20 + ANSWERS + tuple(contexts)


# --- vocabularies ---------------------------------------------------------------------------


# The WordPiece and Unigram trainers of `tokenizers` are not deterministic (hash-map order breaks
# ties, EM sums float in any order), so these two vocabularies are counted here instead: the
# family's own normalizer and pre-tokenizer split the corpus, then single characters (so nothing
# ASCII is unknown) and the pieces covering most text (whole words, word starts, word endings).


def _word_counts(normalizer, pre_tokenizer) -> Counter[str]:
    words: Counter[str] = Counter()
    for line in corpus():
        text = normalizer.normalize_str(line) if normalizer else line
        words.update(word for word, _ in pre_tokenizer.pre_tokenize_str(text))
    return words


def _ranked_pieces(words: Counter[str], alphabet: list[str], inner: str, size: int) -> list[tuple[str, int]]:
    """`alphabet` then the `size` pieces that cover most characters, most first, ties by text.

    `inner` marks a piece that continues a word ("##" in WordPiece, nothing in Metaspace words).
    """
    candidates: Counter[str] = Counter()
    for word, n in words.items():
        candidates[word] += n
        for i in range(2, min(len(word), 7)):
            candidates[word[:i]] += n
        for i in range(max(1, len(word) - 5), len(word) - 1):
            candidates[inner + word[i:]] += n
    chosen = [(a, candidates[a] + 1) for a in alphabet]
    taken = set(alphabet)
    ranked = sorted(candidates.items(), key=lambda kv: (-kv[1] * len(kv[0].removeprefix(inner)), kv[0]))
    chosen += [(piece, n) for piece, n in ranked if piece not in taken][: size - len(chosen)]
    return chosen


def _wordpiece_vocab(specials: list[str]) -> dict[str, int]:
    """Lower-cased WordPiece over BERT's own normalizer and pre-tokenizer."""
    words = _word_counts(normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer())
    chars = sorted({c for word in words for c in word} | {c.lower() for c in ASCII})
    pieces = _ranked_pieces(words, chars + ["##" + c for c in chars], "##", VOCAB_SIZE - len(specials))
    return {piece: i for i, piece in enumerate(specials + [piece for piece, _ in pieces])}


@functools.cache
def _unigram_pieces() -> tuple[tuple[str, float], ...]:
    """SentencePiece-style Unigram pieces over Metaspace words, as XLM-R and DeBERTa-v3 ship them.

    Scores are log frequencies, so Viterbi prefers a whole word to its parts. Callers put their
    own special tokens in front.
    """
    pre = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    words = _word_counts(None, pre)
    chars = sorted({c for word in words for c in word} | set(ASCII) | {"▁"})
    pieces = _ranked_pieces(words, chars, "", VOCAB_SIZE)
    total = sum(n for _, n in pieces)
    return tuple((piece, round(math.log(n / total), 4)) for piece, n in pieces)


def _unigram_vocab(specials: list[str]) -> list[tuple[str, float]]:
    """The Unigram pieces behind `specials` (score 0.0, as sentencepiece exports control tokens)."""
    return [(s, 0.0) for s in specials] + list(_unigram_pieces())


def _byte_bpe(specials: list[str], pre_tokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE (GPT-2 / RoBERTa / Qwen style): every byte is a token, so nothing is unknown."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]


# --- families: each returns (tokenizer, model) -----------------------------------------------


def _bert_like(model_cls, config_cls, max_length, **config):
    from transformers import BertTokenizerFast

    # BERT's ids are [PAD] 0, [UNK] 100, [CLS] 101 ...; ours are 0..4: code must read them, not assume them.
    tokenizer = BertTokenizerFast(
        vocab=_wordpiece_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]), model_max_length=max_length
    )
    cfg = config_cls(
        vocab_size=len(tokenizer), max_position_embeddings=max_length, type_vocab_size=2, pad_token_id=0, num_labels=1,
        **TINY, **config,
    )  # fmt: skip
    return tokenizer, model_cls(cfg)


def _bert(max_length):
    from transformers import BertConfig, BertForSequenceClassification

    return _bert_like(BertForSequenceClassification, BertConfig, max_length)


def _electra(max_length):
    from transformers import ElectraConfig, ElectraForSequenceClassification

    return _bert_like(ElectraForSequenceClassification, ElectraConfig, max_length, embedding_size=TINY["hidden_size"])


def _roberta_config(config_cls, tokenizer, max_length):
    # Position ids start after padding_idx (1), hence 512 + 2 positions, like every RoBERTa checkpoint.
    return config_cls(
        vocab_size=len(tokenizer), max_position_embeddings=max_length + 2, type_vocab_size=1, num_labels=1,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, **TINY,
    )  # fmt: skip


def _xlm_roberta(max_length):
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification, XLMRobertaTokenizerFast

    # fairseq order, as in every XLM-R checkpoint: <s> 0, <pad> 1, </s> 2, <unk> 3; <mask> comes last.
    vocab = _unigram_vocab(["<s>", "<pad>", "</s>", "<unk>"])
    tokenizer = XLMRobertaTokenizerFast(vocab=vocab + [("<mask>", 0.0)], model_max_length=max_length)
    return tokenizer, XLMRobertaForSequenceClassification(_roberta_config(XLMRobertaConfig, tokenizer, max_length))


def _roberta(max_length):
    from transformers import RobertaConfig, RobertaForSequenceClassification, RobertaTokenizerFast

    vocab, merges = _byte_bpe(["<s>", "<pad>", "</s>", "<unk>"], pre_tokenizers.ByteLevel(add_prefix_space=False))
    vocab["<mask>"] = len(vocab)
    tokenizer = RobertaTokenizerFast(vocab=vocab, merges=merges, model_max_length=max_length)
    return tokenizer, RobertaForSequenceClassification(_roberta_config(RobertaConfig, tokenizer, max_length))


def _deberta_v2(max_length):
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification, DebertaV2TokenizerFast

    # DeBERTa-v3's spm order: [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3; [MASK] is appended after the pieces.
    vocab = _unigram_vocab(["[PAD]", "[CLS]", "[SEP]", "[UNK]"])
    tokenizer = DebertaV2TokenizerFast(vocab=vocab + [("[MASK]", 0.0)], unk_id=3, model_max_length=max_length)
    # v3 settings: relative attention only, no absolute positions, and type_vocab_size 0, so the
    # tokenizer's 0/1 token types reach the model and are ignored there.
    cfg = DebertaV2Config(
        vocab_size=len(tokenizer), max_position_embeddings=max_length, type_vocab_size=0, num_labels=1,
        relative_attention=True, position_buckets=256, max_relative_positions=-1, norm_rel_ebd="layer_norm",
        share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
        pooler_hidden_size=TINY["hidden_size"], pad_token_id=tokenizer.pad_token_id, **TINY,
    )  # fmt: skip
    return tokenizer, DebertaV2ForSequenceClassification(cfg)


def _modernbert(max_length):
    from transformers import ModernBertConfig, ModernBertForSequenceClassification, PreTrainedTokenizerFast

    # ModernBERT ships a raw tokenizer.json (GPT-NeoX-style byte BPE) with its BERT specials
    # added after the BPE pieces, a [CLS]/[SEP] template and no token_type_ids input.
    vocab, merges = _byte_bpe(["<|endoftext|>"], pre_tokenizers.ByteLevel(add_prefix_space=False))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    tok.add_special_tokens(specials)
    ids = {s: tok.token_to_id(s) for s in specials}
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
        mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"], model_max_length=max_length,
    )  # fmt: skip
    cfg = ModernBertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=max_length, num_labels=1, pad_token_id=ids["[PAD]"],
        bos_token_id=ids["[CLS]"], cls_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"],
        sep_token_id=ids["[SEP]"], **TINY,
    )  # fmt: skip
    return tokenizer, ModernBertForSequenceClassification(cfg)


def _qwen3(max_length):
    from transformers import Qwen2TokenizerFast, Qwen3Config, Qwen3ForCausalLM
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # Qwen's own pre-tokenizer (digits one by one, contractions, ...) so merges match what it applies.
    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    vocab, merges = _byte_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], pre)
    tokenizer = Qwen2TokenizerFast(
        vocab=vocab, merges=merges, unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"], model_max_length=max_length,
    )  # fmt: skip
    # Like Qwen3, <think> and </think> are added tokens that are not special.
    tokenizer.add_tokens(["<think>", "</think>"])
    for answer in ("yes", "no"):
        if len(tokenizer(answer, add_special_tokens=False).input_ids) != 1:
            raise AssertionError(f"qwen3 fixture: {answer!r} is not a single token; grow ANSWERS in the corpus")
    # Like Qwen3 (151936 rows for 151669 tokens), the embedding has spare rows past the tokenizer.
    cfg = Qwen3Config(
        vocab_size=-(-len(tokenizer) // 64) * 64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=max_length,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )  # fmt: skip
    return tokenizer, Qwen3ForCausalLM(cfg)


_BUILDERS: dict[str, Callable] = {
    "bert": _bert,
    "electra": _electra,
    "xlm-roberta": _xlm_roberta,
    "roberta": _roberta,
    "deberta-v2": _deberta_v2,
    "modernbert": _modernbert,
    "qwen3": _qwen3,
}
assert tuple(_BUILDERS) == FAMILIES


def build_family(kind: str, out: Path, max_length: int = MAX_LENGTH) -> Path:
    """Save a tiny random checkpoint of family `kind` (config, safetensors, tokenizer) into `out`, reading
    `max_length` tokens (its positions and its tokenizer's limit; longp's tests build 4k-8k ones).

    Seeded: the same kind gives the same weights and vocabulary on every call.
    """
    if kind not in _BUILDERS:
        raise ValueError(f"unknown family {kind!r}; known: {', '.join(FAMILIES)}")
    torch.manual_seed(0)
    tokenizer, model = _BUILDERS[kind](max_length)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def served_side_by_side(folders: dict[str, Path]):
    """One embedded Triton serving each prepared folder under its name (KEYRANK_MODELS), on free ports: ``with``
    it. (A repository folder of its own would be staged with its first model only.)"""
    from keyrank.config import Settings
    from keyrank.modelserver.embedded import EmbeddedTriton

    served = ",".join(f"{name}={folder}" for name, folder in folders.items())
    return EmbeddedTriton(settings=Settings(models=served, embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0))


_built: dict[str, Path] = {}


def family_checkpoint(kind: str, tmp_path_factory) -> Path:
    """`build_family` once per test session (pytest's session-scoped `tmp_path_factory`), then reused."""
    if kind not in _built or not (_built[kind] / "config.json").is_file():
        _built[kind] = build_family(kind, tmp_path_factory.mktemp(f"family-{kind}"))
    return _built[kind]
