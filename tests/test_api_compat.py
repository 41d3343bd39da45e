"""The Jina/Cohere routes accept what the vendors' clients send, say which fields changed nothing
(X-Keyrank-Ignored-Fields), and read object documents as Cohere does (text, or rank_fields)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from keyrank.api import create_app
from keyrank.api.routes.cohere import document_text
from keyrank.config import Settings
from keyrank.errors import InvalidRequest

QUERY = "what is a cat"
DOCS = ["The stock market fell on Monday.", "A cat is a small carnivorous mammal kept as a pet."]


def test_object_documents_are_read_by_text_or_by_rank_fields_in_their_order():
    doc = {"title": "Cats", "body": "A cat is a pet.", "year": 2024, "text": "plain"}
    assert document_text(doc, None, 0) == "plain"
    assert document_text(doc, ["year", "title"], 0) == "year: 2024\ntitle: Cats"
    assert document_text(doc, ["title", "missing"], 0) == "title: Cats"
    assert document_text(doc, ["missing"], 0) == "plain"
    with pytest.raises(InvalidRequest, match=r"documents\[3\].*rank_fields.*text"):
        document_text({"body": "x"}, ["missing"], 3)
    with pytest.raises(InvalidRequest, match=r"documents\[1\].*text"):
        document_text({"body": "no text field"}, None, 1)


@pytest.fixture(scope="module")
def live(prepared_models, embedded_triton):
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url)
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.mark.triton
def test_fields_that_change_nothing_are_named_in_a_header(live):
    body = {"model": "rerank-v3.5", "query": QUERY, "documents": DOCS, "priority": 3, "max_chunks_per_doc": 5, "truncate": "END"}
    response = live.post("/v2/rerank", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-keyrank-ignored-fields"] == "model, max_chunks_per_doc, priority, truncate"
    assert [r["index"] for r in response.json()["results"]] == [1, 0]


@pytest.mark.triton
def test_nothing_ignored_means_no_header(live):
    response = live.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 1, "return_documents": False})
    assert response.status_code == 200
    assert "x-keyrank-ignored-fields" not in response.headers
    results = response.json()["results"]
    assert [r["index"] for r in results] == [1] and set(results[0]) == {"index", "relevance_score"}


@pytest.mark.triton
def test_jina_return_embeddings_is_accepted_and_named(live):
    response = live.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "return_embeddings": True})
    assert response.status_code == 200
    assert response.headers["x-keyrank-ignored-fields"] == "return_embeddings"


@pytest.mark.triton
def test_unknown_field_names_are_percent_encoded_in_the_header(live):
    response = live.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "tëmp\nx": 1})
    assert response.status_code == 200
    assert response.headers["x-keyrank-ignored-fields"] == "t%C3%ABmp%0Ax"


@pytest.mark.triton
def test_rank_fields_decide_what_is_read(live):
    documents = [{"title": "cats are small pets", "body": "the stock market fell"},
                 {"title": "the stock market fell", "body": "cats are small pets"}]
    by_title = live.post("/v1/rerank", json={"query": QUERY, "documents": documents, "rank_fields": ["title"]}).json()
    by_body = live.post("/v1/rerank", json={"query": QUERY, "documents": documents, "rank_fields": ["body"]}).json()
    assert by_title["results"][0]["index"] == 0 and by_body["results"][0]["index"] == 1
    assert by_title["results"][0]["document"] == documents[0]  # echoed as sent (Jina's default: documents on)


@pytest.mark.triton
def test_cohere_v2_echoes_documents_only_when_asked(live):
    plain = live.post("/v2/rerank", json={"model": "m", "query": QUERY, "documents": DOCS}).json()
    assert all(set(r) == {"index", "relevance_score"} for r in plain["results"])
    echoed = live.post("/v2/rerank", json={"model": "m", "query": QUERY, "documents": DOCS, "return_documents": True}).json()
    assert echoed["results"][0]["document"] == {"text": DOCS[1]}
