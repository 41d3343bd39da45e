"""BM25 block scores against reference implementations (rank-bm25, scikit-learn)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keyrank.select.bm25 import (
    IdfTable,
    block_terms,
    bm25_scores,
    smoothed_idf,
    term_mask,
)
from keyrank.tokenize import TextTokenizer
from rank_bm25 import BM25Okapi
from shared_data import CE_MODEL, DATASETS
from sklearn.feature_extraction.text import TfidfVectorizer

TOKENIZER = TextTokenizer.from_file(CE_MODEL / "tokenizer.json")
IS_TERM = term_mask(TOKENIZER)

token_lists = st.lists(st.lists(st.integers(1000, 1030), min_size=0, max_size=40), min_size=1, max_size=25)


def _as_blocks(corpus):
    return block_terms([np.asarray(doc, dtype=np.int64) for doc in corpus], np.ones(2000, dtype=bool))


@settings(max_examples=200, deadline=None)
@given(token_lists, st.lists(st.integers(1000, 1030), min_size=1, max_size=6), st.floats(0.1, 2.0), st.floats(0.0, 1.0))
def test_bm25_equals_rank_bm25_given_the_same_idf(corpus, query, k1, b):
    if sum(map(len, corpus)) == 0:
        return
    reference = BM25Okapi([list(map(str, doc)) for doc in corpus], k1=k1, b=b)
    # Same IDF as the reference (its own Robertson-Sparck-Jones variant) so only the BM25 sum is compared.
    table = IdfTable({int(t): v for t, v in reference.idf.items()}, default=0.0)
    ours = bm25_scores(np.asarray(query, dtype=np.int64), _as_blocks(corpus), k1=k1, b=b, idf_table=table)
    expected = reference.get_scores(list(map(str, query)))
    # rank-bm25 divides 0 by 0 for an empty block when b = 1 (NaN); a block without terms scores 0.
    expected = np.where(np.isnan(expected) & (np.array([len(d) for d in corpus]) == 0), 0.0, expected)
    np.testing.assert_allclose(ours, expected, rtol=1e-9, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(token_lists, st.lists(st.integers(0, 4), min_size=1, max_size=8), st.lists(st.integers(1000, 1030), min_size=1, max_size=6))
def test_per_document_scores_are_each_documents_own(corpus, sizes, query):
    """With per-document IDF and length, a call over several documents (some with no blocks at all) scores each
    block as a call over its document alone does."""
    counts, left = [], len(corpus)
    for size in sizes:  # the blocks cut into documents of these sizes, zeros kept; the rest to the last
        counts.append(min(size, left))
        left -= counts[-1]
    counts[-1] += left
    query = np.asarray(query, dtype=np.int64)
    together = bm25_scores(query, _as_blocks(corpus), per_document=counts)
    alone, at = [], 0
    for n in counts:
        if n:
            alone.append(bm25_scores(query, _as_blocks(corpus[at:at + n]), per_document=[n]))
        at += n
    np.testing.assert_array_equal(together, np.concatenate(alone))


def test_default_idf_is_scikit_learns_smoothed_idf():
    corpus = [[1000, 1001, 1002], [1001, 1003], [1001, 1002, 1004, 1004], [1005]]
    vectorizer = TfidfVectorizer(analyzer=lambda doc: doc, smooth_idf=True).fit([list(map(str, d)) for d in corpus])
    reference = dict(zip(vectorizer.get_feature_names_out(), vectorizer.idf_))
    df = np.array([sum(t in d for d in corpus) for t in (1000, 1001, 1002, 1003, 1004, 1005)])
    ours = smoothed_idf(df, len(corpus))
    np.testing.assert_allclose(ours, [reference[str(t)] for t in (1000, 1001, 1002, 1003, 1004, 1005)])


def test_bm25_on_real_text_finds_the_paragraph_of_most_questions():
    squad = json.loads((DATASETS / "squad2-dev-half" / "dev-v2.0.json").read_text())
    paragraphs = squad["data"][0]["paragraphs"]
    enc = TOKENIZER.encode_documents([p["context"] for p in paragraphs])
    blocks = block_terms([e.ids for e in enc], IS_TERM)
    hits, total = 0, 0
    for index, paragraph in enumerate(paragraphs):
        for qa in paragraph["qas"]:
            if qa.get("is_impossible"):
                continue
            query = TOKENIZER.encode_query(qa["question"], 32).ids
            hits += int(np.argmax(bm25_scores(query[IS_TERM[query]], blocks)) == index)
            total += 1
    # Chance is 1 / len(paragraphs) (~2%); lexical matching should find most answers.
    assert total > 50 and hits / total > 0.5


def test_punctuation_is_not_a_term():
    enc = TOKENIZER.encode_documents(["Hello, world! (really) ##"])[0]
    kept = [TOKENIZER.id_to_token(int(t)) for t in enc.ids[IS_TERM[enc.ids]]]
    assert kept == ["hello", "world", "really"]


@pytest.mark.parametrize("k1,b", [(0.9, 0.4), (1.2, 0.75)])
def test_a_block_without_query_terms_scores_zero(k1, b):
    blocks = _as_blocks([[1000, 1001], [1002, 1003]])
    scores = bm25_scores(np.array([1000]), blocks, k1=k1, b=b)
    assert scores[0] > 0 and scores[1] == 0


# --------------------------------------------------------------------------- the served path


@pytest.mark.parametrize("source", ["document", "general", "request"])
@pytest.mark.parametrize("cache_bytes", [0, 64 << 20], ids=["no-cache", "document-cache"])
def test_the_served_bm25_selector_scores_exactly_the_blocks_the_pipeline_cut(prepared_models, cache_bytes, source):
    """Pipeline -> document cache -> the pipeline's bm25 selector: every block of two documents, scored with the
    source's IDF, equals bm25_scores (tested against rank-bm25 above) over those blocks' terms, cached or
    not: the cache keeps terms, which no IDF source changes."""
    from keyrank.config import Settings
    from keyrank.pipeline import Pipeline, RerankOptions
    from keyrank.select.bm25 import general_table

    settings = Settings(model_dir=prepared_models, triton_url="unused", document_cache_bytes=cache_bytes, bm25_idf=source)
    pipeline = Pipeline.from_model_dir(settings)
    query = "budget of the remote control"
    docs = ["The remote control budget is 12.50 euros. " * 6 + "Lunch was fine. " * 30,
            "We talked about the weather and lunch. " * 20 + "A remote for the television. " * 3]
    for _ in range(2):  # the second time from the cache when it is on
        segmented = pipeline.start(query, docs, RerankOptions(strategy="keyb2", selector="bm25"))
        served = pipeline.block_selector("bm25").score(query, segmented.query, segmented.docs, segmented.pieces)
        blocks = [d.ids[a:b] for d, sp in zip(segmented.docs, segmented.pieces) for a, b in zip(sp.starts, sp.ends)]
        flat = block_terms(blocks, pipeline.is_term)
        expected = bm25_scores(segmented.query.ids[pipeline.is_term[segmented.query.ids]], flat, k1=0.9, b=0.4,
                               idf_table=general_table(pipeline.tokenizer) if source == "general" else None,
                               per_document=None if source == "request" else [len(sp) for sp in segmented.pieces])
        np.testing.assert_array_equal(np.concatenate(served), expected)
        assert [len(s) for s in served] == [len(sp) for sp in segmented.pieces]
    best_doc0 = int(np.argmax(served[0]))
    assert "remote control budget" in segmented.docs[0].text[slice(*segmented.docs[0].char_span(segmented.pieces[0].starts[best_doc0], segmented.pieces[0].ends[best_doc0]))]
