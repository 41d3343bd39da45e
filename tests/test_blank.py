"""One "nothing to read" rule for queries and documents (keyrank/blank.py), on every route and in the Python API.

A query of tag characters (U+E0020...) or private-use characters (U+E000) got 200 with 0 query tokens; a
document of private-use characters was read as 0 tokens yet outranked a real document (-1.707 vs -2.606),
while one of tag characters was blank. Now both are blank documents (ranked last, unscored) and refused
queries (422 naming ``query``), over HTTP and in ``Reranker``.

The routes run on ``Reranker.local`` (the prepared model scored in this process, no Triton).
"""

from __future__ import annotations

import re
import sys

import pytest
from fastapi.testclient import TestClient
from keyrank.api import create_app
from keyrank.blank import BLANK_DOCUMENT_SCORE
from keyrank.blank import READABLE, is_blank, is_readable_query
from keyrank.config import Settings
from keyrank.errors import InvalidRequest

TAGS = "\U000e0020\U000e0068\U000e0069\U000e007f"  # tag space, tag "h", tag "i", cancel tag
PRIVATE_USE = "\ue000\ue001\uf8ff"
SUPPLEMENTARY_PRIVATE_USE = "\U000f0000\U0010fffd"
NONCHARACTERS = "\ufdd0\ufffe\uffff\U0001fffe\U0010ffff"
VARIATION_SELECTORS_SUPPLEMENT = "\U000e0100\U000e01ef"
NOTHING_TO_READ = {
    "tags": TAGS,
    "private-use": PRIVATE_USE,
    "supplementary-private-use": SUPPLEMENTARY_PRIVATE_USE,
    "mixed": " \ue000\U000e0041\u200b\U000f0001\t",
    "replacement-character": "\ufffd\ufffd",
    "noncharacters": NONCHARACTERS,
    "variation-selectors-supplement": VARIATION_SELECTORS_SUPPLEMENT,
}
BEYOND_THE_PATTERN = {"tags", "supplementary-private-use", "variation-selectors-supplement"}
"""Made only of characters past U+FFFF: the schema's pattern (ECMA-262 without the u flag) cannot name them."""
ROUTES = ("/rerank", "/v1/rerank", "/v2/rerank", "/tei/rerank", "/infinity/rerank")
FRANCE = "what is the capital of France"
BERLIN = "Berlin is the capital of Germany."


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("name", NOTHING_TO_READ)
def test_tag_private_use_and_noncharacter_text_has_nothing_to_read(name):
    text = NOTHING_TO_READ[name]
    assert is_blank(text) and not is_readable_query(text)
    assert not is_blank(text + "a") and is_readable_query(text + "a")


@pytest.mark.parametrize("text", ["a", "😀", "\U00020000", "\U0001d400", "\u0378", "\U0001fff0", "ภาษา"])
def test_letters_symbols_and_unassigned_characters_stay_readable(text):
    """An unassigned code point (U+0378, U+1FFF0) may be assigned by a later Unicode: never blank for that."""
    assert not is_blank(text) and is_readable_query(text)


def test_the_schema_pattern_names_the_rule_in_the_basic_multilingual_plane():
    """The pattern and the whole rule agree on every character up to U+FFFF (surrogates apart: JSON cannot
    carry a lone one), and the pattern takes every character past it, which only the rule reads."""
    pattern = re.compile(READABLE)
    for c in range(0x10000):
        if 0xD800 <= c < 0xE000:
            continue
        assert (pattern.search(chr(c)) is None) == is_blank(chr(c)), hex(c)
    assert all(pattern.search(NOTHING_TO_READ[name]) for name in BEYOND_THE_PATTERN)


def test_whatever_the_tokenizer_reads_no_token_from_is_blank(prepared_models):
    """Every character of the Basic Multilingual Plane and of the planes of supplementary letters, tags and
    private use from which the served tokenizer reads no token at all is unreadable by the rule: no document
    the model would read as empty is scored, no query it would read as empty is taken. (The rule also calls
    blank what the tokenizer reads only as [UNK]: an enclosing mark, a Hangul filler, a noncharacter.)"""
    import unicodedata

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(prepared_models / "gateway" / "tokenizer.json"))
    codes = [c for c in [*range(0x20000), *range(0xE0000, 0xE1000), *range(0xF0000, 0xF1000), *range(0x10F000, sys.maxunicode + 1)]
             if not 0xD800 <= c < 0xE000]
    text = " ".join(map(chr, codes))  # each character a word of its own, at 2 * its position
    read = {start for start, end in tokenizer.encode(text, add_special_tokens=False).offsets for start in range(start, end)}
    silent = [c for i, c in enumerate(codes) if 2 * i not in read]
    assert len(silent) > 12_000  # private use, controls, format, combining marks
    readable = [c for c in silent if not is_blank(chr(c))]
    # The tokenizer's Unicode tables are older than Python's: U+1734 was a combining mark until Unicode 14.
    assert all(unicodedata.category(chr(c)) == "Mc" for c in readable), [hex(c) for c in readable]
    assert len(readable) <= 2


# --------------------------------------------------------------------------- queries: a 422 naming query


@pytest.fixture(scope="module")
def local_reranker(prepared_models):
    from keyrank.reranker import Reranker

    with Reranker.local(prepared_models) as reranker:
        yield reranker


@pytest.fixture(scope="module")
def client(prepared_models, local_reranker):
    with TestClient(create_app(Settings(model_dir=prepared_models), reranker=local_reranker)) as c:
        yield c


def _body(path: str, query: str, documents: list[str]) -> dict:
    key = "texts" if path == "/tei/rerank" else "documents"
    return {**({"model": "rerank-v3.5"} if path == "/v2/rerank" else {}), "query": query, key: documents}


def _error(response) -> tuple[str | None, str]:
    body = response.json()
    error = body.get("error")
    if isinstance(error, dict):
        return error.get("field"), error["message"]
    return body.get("field"), error  # TEI


@pytest.mark.parametrize("name", NOTHING_TO_READ)
@pytest.mark.parametrize("path", ROUTES)
def test_a_query_with_nothing_to_read_is_a_422_naming_query_on_every_route(client, path, name):
    response = client.post(path, json=_body(path, NOTHING_TO_READ[name], [BERLIN]))
    assert response.status_code == 422, response.text
    field, message = _error(response)
    assert field == "query" and "readable character" in message and "private-use" in message, message


@pytest.mark.parametrize("name", NOTHING_TO_READ)
def test_the_python_api_refuses_a_query_with_nothing_to_read(local_reranker, name):
    with pytest.raises(InvalidRequest, match="readable character") as refused:
        local_reranker.rank(NOTHING_TO_READ[name], [BERLIN])
    assert refused.value.field == "query"


def test_a_query_with_a_readable_character_among_them_is_taken(client):
    response = client.post("/rerank", json={"query": TAGS + "France" + PRIVATE_USE, "documents": [BERLIN]})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["query_tokens"] > 0


# --------------------------------------------------------------------------- documents: blank, ranked last, unscored

BLANK_DOCUMENTS = {"tags": TAGS, "private-use": PRIVATE_USE, "supplementary-private-use": SUPPLEMENTARY_PRIVATE_USE,
                   "replacement-character": "\ufffd"}


@pytest.mark.parametrize("name", BLANK_DOCUMENTS)
@pytest.mark.parametrize("path", ["/rerank", "/v2/rerank", "/tei/rerank"])
def test_a_document_with_nothing_to_read_ranks_last_unscored_on_the_routes(client, local_reranker, path, name):
    """The private-use document outranked the real one (-1.707 vs -2.606): it was scored as an empty one."""
    scored: list[list[str]] = []  # what the pipeline tokenizes and the model scores
    pipeline = local_reranker.pipeline
    start = pipeline.start

    def recording(query, documents, *args):
        scored.append(list(documents))
        return start(query, documents, *args)

    pipeline.start = recording
    try:
        response = client.post(path, json=_body(path, FRANCE, [BLANK_DOCUMENTS[name], BERLIN]))
    finally:
        del pipeline.start
    assert response.status_code == 200, response.text
    results = response.json() if path == "/tei/rerank" else response.json()["results"]
    assert [r["index"] for r in results] == [1, 0]
    score = results[1]["relevance_score" if path != "/tei/rerank" else "score"]
    assert score == (BLANK_DOCUMENT_SCORE if path == "/rerank" else 0.0)
    assert scored == [[BERLIN]]


@pytest.mark.parametrize("name", BLANK_DOCUMENTS)
def test_a_document_with_nothing_to_read_ranks_last_unscored_in_the_python_api(local_reranker, name):
    alone = local_reranker.rank(FRANCE, [BERLIN])
    ranking = local_reranker.rank(FRANCE, [BLANK_DOCUMENTS[name], BERLIN, ""])
    assert [r.index for r in ranking.results] == [1, 0, 2]
    assert [r.score for r in ranking.results[1:]] == [BLANK_DOCUMENT_SCORE] * 2
    assert ranking.results[0].score == pytest.approx(alone.results[0].score, abs=1e-5)
    assert all(r.evidence == [] and r.document_tokens == 0 for r in ranking.results[1:])
    assert ranking.usage == alone.usage  # never tokenized, never scored
    top = local_reranker.rank(FRANCE, [BLANK_DOCUMENTS[name], BERLIN], top_n=1)
    assert [r.index for r in top.results] == [1]


def test_the_python_api_answers_documents_that_are_all_blank(local_reranker):
    ranking = local_reranker.rank(FRANCE, [TAGS, PRIVATE_USE, ""], top_n=2)
    assert [(r.index, r.score) for r in ranking.results] == [(0, BLANK_DOCUMENT_SCORE), (1, BLANK_DOCUMENT_SCORE)]
    assert ranking.usage.scored_sequences == 0
