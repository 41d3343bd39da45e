"""Stable BM25 scores: a document's score and evidence do not depend on the other candidates.

The IDF sources (``KEYRANK_BM25_IDF``): ``document`` (the document's own blocks), ``table`` (a
collection's table, ``keyrank idf --docs``), ``general`` (the table keyrank ships, ``keyrank idf
--general``) and ``request`` (every block of the request: the old behaviour, kept as an option).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keyrank.config import Settings
from keyrank.select.bm25 import GENERAL_TABLE, IdfTable, block_terms, bm25_scores, term_mask
from keyrank.select.idf import general_idf, main, write_table
from keyrank.tokenize import TextTokenizer
from shared_data import CE_MODEL, DATASETS
from sklearn.feature_extraction.text import TfidfVectorizer

TOKENIZER = TextTokenizer.from_file(CE_MODEL / "tokenizer.json")
IS_TERM = term_mask(TOKENIZER)

QUERY = "what may the remote control cost to produce"
FILLER = ("The committee reviewed the minutes of the previous session and approved them. "
          "Several members asked about the schedule of the spring workshops in the east building. ")
TARGET = (FILLER * 12 + "Marketing: the remote control must not cost more than 12.50 euros to produce. " + FILLER * 4
          + "The control panel of the building was repaired. " + FILLER * 3)
# Two candidate sets around TARGET: the second is full of "control" and "remote", so a request-wide IDF
# weighs those terms down and changes which of TARGET's blocks look best.
OTHERS_A = ["Whisk the eggs with the sugar and bake for twenty minutes. " * 10, FILLER * 6]
OTHERS_B = ["Remote control, remote control: the control of the remote is under control. " * 12,
            "Cost, cost, cost: we produce what it costs to produce. " * 12, "Quality control of the remote sites. " * 15]


# --------------------------------------------------------------------------- the arithmetic


doc_blocks = st.lists(st.lists(st.integers(1000, 1012), min_size=0, max_size=12), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(st.lists(doc_blocks, min_size=2, max_size=5), st.lists(st.integers(1000, 1012), min_size=1, max_size=5), st.data())
def test_per_document_scores_do_not_depend_on_the_other_documents(docs, query, data):
    """Scored with others or alone, in any order, a document's block scores are the same bits; and they
    equal the per-request formula applied to that document alone."""
    q = np.asarray(query, dtype=np.int64)

    def scores(chosen):
        flat = block_terms([np.asarray(b, dtype=np.int64) for d in chosen for b in d], np.ones(2000, dtype=bool))
        out = bm25_scores(q, flat, per_document=np.array([len(d) for d in chosen]))
        return np.split(out, np.cumsum([len(d) for d in chosen])[:-1])

    together = scores(docs)
    order = data.draw(st.permutations(range(len(docs))))
    shuffled = scores([docs[i] for i in order])
    for position, i in enumerate(order):
        assert np.array_equal(shuffled[position], together[i])
        alone = scores([docs[i]])[0]
        assert np.array_equal(alone, together[i])
        flat = block_terms([np.asarray(b, dtype=np.int64) for b in docs[i]], np.ones(2000, dtype=bool))
        np.testing.assert_allclose(alone, bm25_scores(q, flat), rtol=1e-12, atol=1e-12)


def test_the_request_source_still_depends_on_the_other_documents():
    """The defect the stable sources remove (and the reason this option is not the default)."""
    target = TOKENIZER.encode_documents([TARGET])[0].ids
    blocks = [target[i : i + 63] for i in range(0, len(target), 63)]
    query = TOKENIZER.encode_query(QUERY, 32).ids
    query = query[IS_TERM[query]]
    others = [TOKENIZER.encode_documents([t])[0].ids for t in OTHERS_B]
    alone = bm25_scores(query, block_terms(blocks, IS_TERM))
    crowded = bm25_scores(query, block_terms(blocks + others, IS_TERM))[: len(blocks)]
    assert not np.allclose(alone, crowded)


# --------------------------------------------------------------------------- the served path


def _rank(reranker, others, selector="bm25"):
    ranking = reranker.rank(QUERY, [*others, TARGET], strategy="keyb2", selector=selector)
    (mine,) = [r for r in ranking.results if r.index == len(others)]
    return mine.score, [(e.start, e.end) for e in mine.evidence]


@pytest.fixture(scope="module")
def corpus_table(tmp_path_factory, prepared_models) -> Path:
    """``keyrank idf --docs`` over a small collection of real text (SQuAD contexts) and the test's texts."""
    folder = tmp_path_factory.mktemp("idf")
    squad = json.loads((DATASETS / "squad2-dev-half" / "dev-v2.0.json").read_text())
    texts = [p["context"] for article in squad["data"][:3] for p in article["paragraphs"]] + [TARGET, *OTHERS_A, *OTHERS_B]
    docs = folder / "corpus.jsonl"
    docs.write_text("\n".join(json.dumps({"id": str(i), "text": t}) if i % 2 else json.dumps({"text": t}) for i, t in enumerate(texts)))
    out = folder / "idf.json"
    assert main(["--docs", str(docs), "--out", str(out), "--model-dir", str(prepared_models)]) == 0
    return out


@pytest.mark.triton
@pytest.mark.parametrize("source", ["document", "general", "table"])
@pytest.mark.parametrize("selector", ["bm25", "hybrid"])
def test_a_document_gets_the_same_score_and_evidence_whatever_the_other_candidates(
        prepared_models, embedded_triton, corpus_table, source, selector):
    """The real Reranker on the real Triton, each stable source, both selectors that read BM25."""
    from keyrank.reranker import Reranker

    table = corpus_table if source == "table" else None
    with Reranker(Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url, bm25_idf=source, bm25_idf_table=table)) as r:
        first, second, third = _rank(r, OTHERS_A, selector), _rank(r, OTHERS_B, selector), _rank(r, [], selector)
    assert first == second == third
    assert first[1], "keyb2 reads some evidence"


@pytest.mark.triton
def test_the_default_gives_the_same_score_and_evidence_over_http(gateway_url):
    """The default source, through the live gateway: the same document with two candidate sets."""
    assert Settings().bm25_idf != "request"
    got = []
    for others in (OTHERS_A, OTHERS_B):
        body = {"query": QUERY, "documents": [*others, TARGET], "strategy": "keyb2", "selector": "bm25"}
        answer = httpx.post(f"{gateway_url}/rerank", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        (mine,) = [r for r in answer.json()["results"] if r["index"] == len(others)]
        got.append((mine["relevance_score"], mine["evidence"]))
    assert got[0] == got[1]


# --------------------------------------------------------------------------- keyrank idf


def test_keyrank_idf_writes_scikit_learns_smoothed_idf_and_the_served_path_reads_it(corpus_table, prepared_models):
    from keyrank.pipeline import Pipeline, RerankOptions

    table = json.loads(corpus_table.read_text())
    squad = json.loads((DATASETS / "squad2-dev-half" / "dev-v2.0.json").read_text())
    texts = [p["context"] for article in squad["data"][:3] for p in article["paragraphs"]] + [TARGET, *OTHERS_A, *OTHERS_B]
    pipeline = Pipeline.from_model_dir(Settings(model_dir=prepared_models, bm25_idf_table=corpus_table))
    analyzed = [[TOKENIZER.id_to_token(int(t)) for t in e.ids[pipeline.is_term[e.ids]]] for e in pipeline.tokenizer.encode_documents(texts)]
    reference = TfidfVectorizer(analyzer=lambda doc: doc, smooth_idf=True).fit(analyzed)
    expected = dict(zip(reference.get_feature_names_out(), reference.idf_))
    assert set(table) == set(expected)
    for token, idf in expected.items():
        assert table[token] == pytest.approx(idf, abs=1e-6)

    assert pipeline.settings.bm25_idf == "table"  # KEYRANK_BM25_IDF_TABLE alone selects the table, as before
    segmented = pipeline.start(QUERY, [TARGET, *OTHERS_A], RerankOptions(strategy="keyb2", selector="bm25"))
    served = np.concatenate(pipeline.block_selector("bm25").score(QUERY, segmented.query, segmented.docs, segmented.pieces))
    flat = block_terms([d.ids[a:b] for d, sp in zip(segmented.docs, segmented.pieces) for a, b in zip(sp.starts, sp.ends)], pipeline.is_term)
    lookup = IdfTable({TOKENIZER.token_to_id(t): v for t, v in table.items()}, default=max(table.values()))
    query = segmented.query.ids[pipeline.is_term[segmented.query.ids]]
    np.testing.assert_array_equal(served, bm25_scores(query, flat, idf_table=lookup, per_document=[len(p) for p in segmented.pieces]))


def test_keyrank_idf_names_a_bad_line(tmp_path, prepared_models):
    docs = tmp_path / "bad.jsonl"
    docs.write_text('{"text": "fine"}\n{"id": "2", "body": "no text"}\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:2: expected an object with a string \"text\""):
        main(["--docs", str(docs), "--out", str(tmp_path / "x.json"), "--model-dir", str(prepared_models)])


def test_a_table_source_without_a_table_and_a_table_the_source_ignores_are_refused():
    with pytest.raises(ValueError, match="bm25_idf=table needs bm25_idf_table"):
        Settings(bm25_idf="table")
    with pytest.raises(ValueError, match="bm25_idf=request does not read it"):
        Settings(bm25_idf="request", bm25_idf_table="idf.json")


# --------------------------------------------------------------------------- the shipped table


def test_the_shipped_general_table_is_small_and_covers_the_words_of_real_text():
    assert GENERAL_TABLE.stat().st_size < 1_000_000
    table = IdfTable.from_json(GENERAL_TABLE, TOKENIZER)
    # Real English text (SQuAD contexts; only their word pieces are looked up, nothing is tuned on them).
    squad = json.loads((DATASETS / "squad2-dev-half" / "dev-v2.0.json").read_text())
    texts = [p["context"] for article in squad["data"][:20] for p in article["paragraphs"]]
    ids = np.concatenate([e.ids for e in TOKENIZER.encode_documents(texts)])
    ids = ids[IS_TERM[ids]]
    covered = np.array([int(t) in table.table for t in ids])
    assert covered.mean() > 0.99
    idf = {w: table.lookup(np.array([TOKENIZER.token_to_id(w)]))[0] for w in ("the", "of", "meeting", "remote", "euros")}
    assert idf["the"] < idf["of"] < idf["meeting"] < idf["remote"] < idf["euros"]


def test_the_shipped_general_table_is_what_the_documented_command_builds(tmp_path):
    """`keyrank idf --general` (wordfreq, pinned in the idf extra) rebuilds the shipped file byte for byte."""
    pytest.importorskip("wordfreq", reason="the idf extra (wordfreq) builds the general table")
    out = tmp_path / "idf-general.json.gz"
    write_table(general_idf(TOKENIZER, IS_TERM), out)
    assert out.read_bytes() == GENERAL_TABLE.read_bytes()
    assert len(json.loads(gzip.decompress(out.read_bytes()))) > 20_000
