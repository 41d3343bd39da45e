"""The TEI and Infinity drop-in routes, the discovery endpoints, opt-in evidence on every vendor route,
and honest coverage (read_tokens / document_tokens / truncated), over HTTP on the real Triton.

The real client libraries are run against these routes in tests/test_clients.py.
"""

from __future__ import annotations

import json
import math

import pytest
from fastapi.testclient import TestClient
from keyrank.api import create_app
from keyrank.config import Settings

from shared_data import DATASETS

QUERY = "what is a cat"
DOCS = ["The stock market fell on Monday.", "A cat is a small carnivorous mammal kept as a pet.", "Paris is in France."]
CAT = 1
DEAD_TRITON = "127.0.0.1:1"

# Every vendor route, with the body its clients send: the request and the list of results in the answer.
VENDOR = {
    "/v1/rerank": ({"query": QUERY, "documents": DOCS}, lambda a: a["results"]),
    "/v2/rerank": ({"model": "ce-minilm-l6", "query": QUERY, "documents": DOCS}, lambda a: a["results"]),
    "/tei/rerank": ({"query": QUERY, "texts": DOCS}, lambda a: a),
    "/infinity/rerank": ({"query": QUERY, "documents": DOCS}, lambda a: a["results"]),
}
EXTENSION = {"evidence", "truncated", "read_tokens", "document_tokens"}


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@pytest.fixture(scope="module")
def live(prepared_models, embedded_triton):
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url)
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def meeting() -> tuple[str, str]:
    """A whole QMSum meeting (tens of thousands of characters) and one of its queries."""
    path = sorted((DATASETS / "qmsum" / "val").glob("*.json"))[0]
    data = json.loads(path.read_text())
    text = "\n".join(f"{t['speaker']}: {t['content']}" for t in data["meeting_transcripts"])
    return data["specific_query_list"][0]["query"], text


# --------------------------------------------------------------------------- TEI


@pytest.mark.triton
def test_tei_rerank_answers_a_sorted_list_of_index_and_sigmoid_score(live):
    own = live.post("/rerank", json={"query": QUERY, "documents": DOCS}).json()["results"]
    response = live.post("/tei/rerank", json={"query": QUERY, "texts": DOCS})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert [r["index"] for r in answer] == [r["index"] for r in own] and answer[0]["index"] == CAT
    assert all(set(r) == {"index", "score"} for r in answer)
    for mine, theirs in zip(own, answer):
        assert theirs["score"] == pytest.approx(_sigmoid(mine["relevance_score"]), rel=1e-6)
    assert "x-keyrank-ignored-fields" not in response.headers


@pytest.mark.triton
def test_tei_raw_scores_and_return_text(live):
    own = live.post("/rerank", json={"query": QUERY, "documents": DOCS}).json()["results"]
    answer = live.post("/tei/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True, "return_text": True}).json()
    assert [r["score"] for r in answer] == pytest.approx([r["relevance_score"] for r in own], rel=1e-6)
    assert answer[0]["score"] > 1.0  # a logit, not a probability
    assert [r["text"] for r in answer] == [DOCS[r["index"]] for r in answer]


@pytest.mark.triton
def test_tei_truncation_fields_are_accepted_and_named_as_ignored(live):
    body = {"query": QUERY, "texts": DOCS, "truncate": True, "truncation_direction": "Left"}
    response = live.post("/tei/rerank", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-keyrank-ignored-fields"] == "truncate, truncation_direction"


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"query": QUERY}, "texts", "required"),
        ({"query": QUERY, "texts": []}, "texts", "at least 1"),
        ({"query": QUERY, "texts": DOCS, "truncation_direction": "Middle"}, "truncation_direction", "Left"),
        ({"query": QUERY, "texts": DOCS, "raw_scores": "yes"}, "raw_scores", "boolean"),
        ({"query": " ", "texts": DOCS}, "query", "non-whitespace"),
    ],
)
def test_tei_bad_requests_get_a_422_in_teis_error_shape_naming_the_field(prepared_models, body, field, words):
    settings = Settings(model_dir=prepared_models, triton_url=DEAD_TRITON, triton_connect_timeout_s=0.5)
    with TestClient(create_app(settings)) as dead:
        response = dead.post("/tei/rerank", json=body)
    assert response.status_code == 422
    error = response.json()
    assert error["error_type"] == "Validation" and error["field"] == field
    assert field in error["error"] and words in error["error"], error


def test_tei_limits_name_texts_as_teis_callers_sent_them(prepared_models):
    settings = Settings(model_dir=prepared_models, triton_url=DEAD_TRITON, triton_connect_timeout_s=0.5,
                        max_documents=2, max_document_chars=40)
    with TestClient(create_app(settings)) as dead:
        too_many = dead.post("/tei/rerank", json={"query": QUERY, "texts": DOCS}).json()
        too_long = dead.post("/tei/rerank", json={"query": QUERY, "texts": DOCS[:2]}).json()
        schema = dead.get("/openapi.json").json()["components"]["schemas"]["TeiRerankRequest"]["properties"]["texts"]
    assert too_many["field"] == "texts" and too_many["error"].startswith("texts: 3 documents exceed the limit of 2 (KEYRANK_MAX_DOCUMENTS)")
    assert too_long["field"] == "texts[1]" and "KEYRANK_MAX_DOCUMENT_CHARS" in too_long["error"]
    assert schema["maxItems"] == 2 and schema["items"]["maxLength"] == 40


@pytest.mark.triton
def test_tei_info_names_the_served_model_and_its_limits(live):
    info = live.get("/tei/info").json()
    assert info["model_id"] == "ce-minilm-l6"
    assert info["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    assert info["max_input_length"] == 512 and info["max_client_batch_size"] == 1000 and info["auto_truncate"] is True


# --------------------------------------------------------------------------- Infinity


@pytest.mark.triton
def test_infinity_rerank_answers_in_infinitys_shape(live):
    own = live.post("/rerank", json={"query": QUERY, "documents": DOCS}).json()
    body = {"model": "default/not-specified", "query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True}
    response = live.post("/infinity/rerank", json=body, headers={"X-Request-ID": "inf-1"})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"object", "results", "model", "usage", "id", "created"}
    assert (answer["object"], answer["model"], answer["id"]) == ("rerank", "ce-minilm-l6", "inf-1")
    assert answer["usage"] == {"prompt_tokens": own["usage"]["scored_tokens"], "total_tokens": own["usage"]["scored_tokens"]}
    assert [r["index"] for r in answer["results"]] == [r["index"] for r in own["results"]][:2]
    for mine, theirs in zip(own["results"], answer["results"]):
        assert set(theirs) == {"relevance_score", "index", "document"}
        assert theirs["document"] == DOCS[theirs["index"]]  # a string, as Infinity answers
        assert theirs["relevance_score"] == pytest.approx(_sigmoid(mine["relevance_score"]), rel=1e-6)
    assert "x-keyrank-ignored-fields" not in response.headers  # the client's placeholder model names none


@pytest.mark.triton
def test_infinity_raw_scores_and_another_models_name(live):
    response = live.post("/infinity/rerank", json={"model": "mixedbread-ai/mxbai-rerank-xsmall-v1", "query": QUERY,
                                                   "documents": DOCS, "raw_scores": True})
    assert response.headers["x-keyrank-ignored-fields"] == "model"
    results = response.json()["results"]
    assert results[0]["index"] == CAT and results[0]["relevance_score"] > 1.0 and "document" not in results[0]


def test_infinity_bad_request_gets_fastapis_detail_list(prepared_models):
    settings = Settings(model_dir=prepared_models, triton_url=DEAD_TRITON, triton_connect_timeout_s=0.5)
    with TestClient(create_app(settings)) as dead:
        response = dead.post("/infinity/rerank", json={"query": QUERY, "documents": [1, 2]})
    assert response.status_code == 422
    error = response.json()
    assert error["detail"][0]["loc"][:2] == ["body", "documents[0]"] and "string" in error["detail"][0]["msg"]


# --------------------------------------------------------------------------- discovery


@pytest.mark.triton
def test_v1_models_and_infinity_models_list_the_served_model(live):
    openai = live.get("/v1/models").json()
    assert openai["object"] == "list" and [m["id"] for m in openai["data"]] == ["ce-minilm-l6"]
    card = openai["data"][0]
    assert set(card) == {"id", "object", "created", "owned_by", "runtime", "precision", "device"}
    assert card["object"] == "model" and card["created"] > 1_600_000_000
    # What scores it (tests/test_served.py): this gateway was pointed at a Triton without being told it is the
    # embedded one, whose model-config API is closed to it: unknown, not guessed.
    assert {card["runtime"], card["precision"], card["device"]} == {"unknown"}
    infinity = live.get("/infinity/models").json()
    assert [m["id"] for m in infinity["data"]] == ["ce-minilm-l6"] and infinity["data"][0]["capabilities"] == ["rerank"]


def test_the_dialects_rerank_routes_need_the_api_key_and_discovery_does_not(prepared_models):
    settings = Settings(model_dir=prepared_models, triton_url=DEAD_TRITON, api_key="s3cret")
    with TestClient(create_app(settings)) as keyed:
        for path, (body, _) in VENDOR.items():
            assert keyed.post(path, json=body).status_code == 401, path
        assert keyed.get("/v1/models").status_code == 200
        assert keyed.get("/tei/info").status_code == 200


# --------------------------------------------------------------------------- ignored fields, alike on every dialect


@pytest.mark.triton
@pytest.mark.parametrize("path", list(VENDOR))
def test_an_unknown_field_is_accepted_and_named_on_every_vendor_route(live, path):
    body, results = VENDOR[path]
    response = live.post(path, json={**body, "temperature": 0.5})
    assert response.status_code == 200, response.text
    assert response.headers["x-keyrank-ignored-fields"] == "temperature"
    assert results(response.json())[0]["index"] == CAT


# --------------------------------------------------------------------------- evidence, opt-in


@pytest.mark.triton
@pytest.mark.parametrize("path", list(VENDOR))
def test_evidence_and_coverage_come_only_when_asked(live, path):
    body, results = VENDOR[path]
    plain = results(live.post(path, json=body).json())
    assert not any(EXTENSION & set(r) for r in plain)
    response = live.post(path, json={**body, "return_evidence": True})
    assert "x-keyrank-ignored-fields" not in response.headers
    asked = results(response.json())
    assert [r["index"] for r in asked] == [r["index"] for r in plain]
    own = {r["index"]: r for r in live.post("/rerank", json={"query": QUERY, "documents": DOCS}).json()["results"]}
    for r in asked:
        assert EXTENSION <= set(r)
        mine = own[r["index"]]
        assert r["evidence"] == [{"start": e["start"], "end": e["end"]} for e in mine["evidence"]]
        assert (r["truncated"], r["read_tokens"], r["document_tokens"]) == (mine["truncated"], mine["read_tokens"], mine["document_tokens"])
        assert r["evidence"] and DOCS[r["index"]][r["evidence"][0]["start"] : r["evidence"][-1]["end"]] == DOCS[r["index"]]


# --------------------------------------------------------------------------- coverage


@pytest.mark.triton
@pytest.mark.parametrize("strategy", ["firstp", "keyb2"])
def test_a_long_meeting_is_reported_as_not_read_whole(live, meeting, strategy):
    query, text = meeting
    short = "Project manager: the remote control must not cost more than 12.50 euros."
    body = {"query": query, "documents": [text, short], "strategy": strategy}
    answer = live.post("/rerank", json=body).json()
    results = {r["index"]: r for r in answer["results"]}
    long, whole = results[0], results[1]
    assert long["truncated"] is True and 0 < long["read_tokens"] < long["document_tokens"], long
    assert whole["truncated"] is False and whole["read_tokens"] == whole["document_tokens"] > 0
    assert answer["usage"]["truncated_documents"] == 1
    assert answer["usage"]["document_tokens"] == long["document_tokens"] + whole["document_tokens"]
    if strategy == "firstp":  # the prefix: what fits next to the query
        assert long["read_tokens"] == 512 - 3 - answer["usage"]["query_tokens"]
        assert long["evidence"] == [{"start": 0, "end": long["evidence"][0]["end"]}]
    if strategy == "keyb2":  # the selected blocks, never over the budget
        assert long["read_tokens"] <= 480


@pytest.mark.triton
def test_maxp_reads_a_document_whole_until_the_window_cap_or_max_tokens_cut_it(live, meeting, prepared_models, embedded_triton):
    query, text = meeting
    middle = text[:6_000]  # a few windows: all of them scored
    whole = live.post("/rerank", json={"query": query, "documents": [middle], "strategy": "maxp"}).json()["results"][0]
    assert whole["truncated"] is False and whole["read_tokens"] == whole["document_tokens"] > 512
    cut = live.post("/rerank", json={"query": query, "documents": [middle], "strategy": "maxp", "max_tokens_per_doc": 100}).json()
    result = cut["results"][0]
    assert result["truncated"] is True and result["read_tokens"] == 100
    assert result["document_tokens"] == whole["document_tokens"]  # the whole document, not the cut
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url, max_windows_per_doc=1)
    with TestClient(create_app(settings)) as capped:
        one = capped.post("/rerank", json={"query": query, "documents": [middle], "strategy": "maxp"}).json()["results"][0]
    budget = 512 - 3 - cut["usage"]["query_tokens"]
    assert one["truncated"] is True and one["read_tokens"] == budget and one["document_tokens"] == whole["document_tokens"]


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/tei/rerank", {"query": QUERY, "texts": ["ok", "bad \ud800 text"]}, "texts[1]"),
    ("/infinity/rerank", {"query": QUERY, "documents": ["bad \ud800 text"]}, "documents[0]"),
])
def test_a_lone_surrogate_is_refused_naming_the_field_on_the_new_dialects(prepared_models, path, body, field):
    settings = Settings(model_dir=prepared_models, triton_url=DEAD_TRITON, triton_connect_timeout_s=0.5)
    raw = json.dumps(body).encode()  # json.dumps writes the lone surrogate as the escape \\ud800
    with TestClient(create_app(settings)) as dead:
        response = dead.post(path, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert field in response.text and "surrogate" in response.text
