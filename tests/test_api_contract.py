"""The HTTP contract: every bad request is a 4xx that names its problem, never a 5xx,
and a dead Triton is a fast 503 with Retry-After, never a hang.

None of these requests reaches a model: the app runs the real Reranker (real
tokenizer from the prepared models) pointed at a Triton that is not there.
"""

from __future__ import annotations

import json
import math
import time

import pytest
from fastapi.testclient import TestClient
from keyrank.api import create_app
from keyrank.config import Settings
from keyrank.schemas import RerankResponse
from prometheus_client import REGISTRY

DEFAULT_STRATEGY = Settings.model_fields["default_strategy"].default
"""What a request that names no strategy is ranked with (keyb2-blocks)."""

DEAD_TRITON = "127.0.0.1:1"  # nothing listens on port 1: connection refused at once
LIMITS = {"max_documents": 5, "max_document_chars": 2_000, "max_query_chars": 200, "max_body_bytes": 64_000}
OK = {"query": "what is a cat", "documents": ["a cat is an animal", "the stock market fell"]}


def _settings(models, **overrides) -> Settings:
    return Settings(
        model_dir=models, triton_url=DEAD_TRITON, retry_after_s=2, triton_connect_timeout_s=0.5, **LIMITS, **overrides
    )


@pytest.fixture(scope="module")
def client(prepared_models):
    with TestClient(create_app(_settings(prepared_models))) as c:
        # Warm-up: the first request also pays for the gRPC channel and the worker threads;
        # the timed tests measure how fast a dead Triton is reported, not process start-up.
        c.post("/rerank", json=OK)
        yield c


@pytest.fixture(scope="module")
def keyed_client(prepared_models):
    with TestClient(create_app(_settings(prepared_models, api_key="s3cret"))) as c:
        yield c


def _with(**fields):
    return {"json": {**OK, **fields}}


def _raw(body: bytes, content_type: str | None = "application/json"):
    return {"content": body, "headers": {"content-type": content_type} if content_type else {}}


# (path, request kwargs, status, words the message must contain)
BAD_INPUTS = [
    pytest.param("/rerank", _with(query=""), 422, ["query"], id="empty-query"),
    pytest.param("/rerank", _with(query="  \n\t"), 422, ["query", "non-whitespace"], id="whitespace-query"),
    pytest.param("/rerank", {"json": {"documents": ["a"]}}, 422, ["query", "required"], id="missing-query"),
    pytest.param("/rerank", _with(documents=[]), 422, ["documents", "at least 1"], id="no-documents"),
    pytest.param("/rerank", _with(documents=["d"] * 6), 422, ["6 documents", "limit of 5", "KEYRANK_MAX_DOCUMENTS"], id="too-many-documents"),
    pytest.param("/rerank", _with(documents=["ok", "x" * 2_001]), 422, ["documents[1]", "2001 characters", "KEYRANK_MAX_DOCUMENT_CHARS"], id="huge-document"),
    pytest.param("/rerank", _with(query="q" * 201), 422, ["query", "201 characters", "KEYRANK_MAX_QUERY_CHARS"], id="huge-query"),
    pytest.param("/rerank", _with(documents="one long string"), 422, ["documents", "valid list"], id="documents-as-string"),
    pytest.param("/rerank", _with(documents=["fine", 7]), 422, ["documents[1]", "valid string"], id="document-as-number"),
    pytest.param("/rerank", _with(documents=[{"id": "a", "text": None}]), 422, ["documents[0].text"], id="document-text-null"),
    pytest.param("/rerank", _with(documents=[{"id": "a", "body": "x"}]), 422, ["documents[0]"], id="document-object-without-text"),
    pytest.param("/rerank", _with(top_n="x"), 422, ["top_n", "integer"], id="top_n-not-a-number"),
    pytest.param("/rerank", _with(top_n=0), 422, ["top_n", "greater than or equal to 1"], id="top_n-zero"),
    pytest.param("/rerank", _with(max_tokens_per_doc=-5), 422, ["max_tokens_per_doc"], id="max_tokens_per_doc-negative"),
    pytest.param("/rerank", _with(return_evidence="maybe"), 422, ["return_evidence", "boolean"], id="flag-not-boolean"),
    pytest.param("/rerank", _with(return_evidence="true"), 422, ["return_evidence", "boolean"], id="flag-as-string-not-coerced"),
    pytest.param("/rerank", _with(top_n="3"), 422, ["top_n", "integer"], id="top_n-as-string-not-coerced"),
    pytest.param("/rerank", _with(top_n=3.5), 422, ["top_n", "integer"], id="top_n-fraction-not-coerced"),
    pytest.param("/rerank", _with(strategy="bestp"), 422, ["strategy", "keyb2", "maxp"], id="unknown-strategy"),
    pytest.param("/rerank", _with(strategy="longp"), 422, ["longp", "at most 512 tokens", "would be firstp"], id="longp-on-a-512-token-model"),
    pytest.param("/rerank", _with(selector="tfidf"), 422, ["selector", "bm25", "dense", "cross"], id="unknown-selector"),
    pytest.param("/rerank", _with(temperature=0.5), 422, ["temperature", "unknown field"], id="unknown-field"),
    pytest.param("/rerank", _raw(b'{"query": "q", "documents": ['), 400, ["not valid JSON", "Expecting value", "line 1, column 30"], id="truncated-json"),
    pytest.param("/rerank", _raw(b"query=q&documents=a", None), 422, ["JSON object", "application/json"], id="form-body-without-content-type"),
    pytest.param("/rerank", _raw(b"hello", "text/plain"), 422, ["JSON object", "application/json"], id="text-plain-body"),
    pytest.param("/rerank", _raw(b"[1, 2]"), 422, ["body", "JSON object"], id="json-array-body"),
    pytest.param("/rerank", _raw(b""), 422, ["body", "JSON object is required"], id="empty-body"),
    pytest.param("/rerank", _raw(b" " * 64_001), 413, ["64001 bytes", "KEYRANK_MAX_BODY_BYTES"], id="body-over-limit"),
    pytest.param("/v1/rerank", _with(documents=["d"] * 6), 422, ["KEYRANK_MAX_DOCUMENTS"], id="jina-too-many-documents"),
    pytest.param("/v1/rerank", _with(documents=[{"url": "http://x"}]), 422, ["documents[0]"], id="jina-document-without-text"),
    pytest.param("/v1/rerank", _with(documents=[{"image": "x.png"}]), 422, ["documents[0]", "text"], id="jina-image-document"),
    pytest.param("/v1/rerank", _with(top_n="2"), 422, ["top_n", "integer"], id="jina-top_n-as-string"),
    pytest.param("/v1/rerank", _with(rank_fields=["title"], documents=[{"body": "x"}]), 422, ["documents[0]", "rank_fields", "text"], id="cohere-v1-rank_fields-missing"),
    pytest.param("/v2/rerank", _with(), 422, ["model", "required"], id="cohere-missing-model"),
    pytest.param("/v2/rerank", {"json": {**OK, "model": "rerank-v3.5", "documents": [{"title": "x"}]}}, 422, ["documents[0]", "text"], id="cohere-document-object-without-text"),
    pytest.param("/v2/rerank", {"json": {**OK, "model": "m", "top_n": True}}, 422, ["top_n", "integer"], id="cohere-top_n-as-boolean"),
    pytest.param("/v2/rerank", {"json": {**OK, "model": "m", "query": " "}}, 422, ["query"], id="cohere-blank-query"),
    pytest.param("/v2/rerank", {"json": {**OK, "model": "m", "documents": ["x" * 2_001]}}, 422, ["KEYRANK_MAX_DOCUMENT_CHARS"], id="cohere-huge-document"),
]


@pytest.mark.parametrize(("path", "request_kwargs", "status", "words"), BAD_INPUTS)
def test_bad_input_is_a_4xx_naming_the_problem(client, path, request_kwargs, status, words):
    started = time.perf_counter()
    response = client.post(path, **request_kwargs)
    assert time.perf_counter() - started < 1.0
    assert response.status_code == status, response.text
    error = response.json()["error"]
    for word in words:
        assert word in error["message"], f"{word!r} not in {error['message']!r}"
    assert error["request_id"] == response.headers["x-request-id"]
    assert "Traceback" not in response.text


def test_body_over_limit_is_refused_while_streaming_without_content_length(client):
    chunks = iter([b" " * 40_000, b" " * 40_000])  # a generator body goes out chunked, no Content-Length
    response = client.post("/rerank", content=chunks, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert "KEYRANK_MAX_BODY_BYTES" in response.json()["error"]["message"]


def test_validation_error_names_the_field_and_lists_every_problem(client):
    response = client.post("/rerank", json={"query": "", "documents": [], "top_n": 0})
    error = response.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["field"] == "query"
    assert {d["field"] for d in error["details"]} == {"query", "documents", "top_n"}


def test_limit_errors_say_limit_exceeded_and_name_the_field(client):
    error = client.post("/rerank", json={**OK, "documents": ["d"] * 6}).json()["error"]
    assert (error["type"], error["field"]) == ("limit_exceeded", "documents")


def _requests_counted(endpoint: str, strategy: str, outcome: str) -> float:
    labels = {"endpoint": endpoint, "strategy": strategy, "outcome": outcome}
    # summed over the model label (one model here)
    return sum(s.value for family in REGISTRY.collect() if family.name == "keyrank_requests" for s in family.samples
               if s.name == "keyrank_requests_total" and labels.items() <= s.labels.items())


def test_bad_requests_are_counted_as_invalid(client):
    unparsed = _requests_counted("/rerank", "-", "invalid")
    over_limit = _requests_counted("/rerank", "maxp", "invalid")
    client.post("/rerank", json={**OK, "strategy": "nope"})
    client.post("/rerank", json={**OK, "strategy": "maxp", "documents": ["d"] * 6})
    assert _requests_counted("/rerank", "-", "invalid") == unparsed + 1
    assert _requests_counted("/rerank", "maxp", "invalid") == over_limit + 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/rerank", {**OK, "strategy": "maxp"}),
        ("/v1/rerank", OK),
        ("/v2/rerank", {**OK, "model": "rerank-v3.5"}),
    ],
)
def test_rerank_with_triton_down_is_503_with_retry_after_within_a_second(client, path, body):
    before = _requests_counted(path, body.get("strategy", DEFAULT_STRATEGY), "unavailable")
    started = time.perf_counter()
    response = client.post(path, json=body)
    elapsed = time.perf_counter() - started
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "2"
    assert response.json()["error"]["type"] == "unavailable"
    assert elapsed < 1.0
    assert _requests_counted(path, body.get("strategy", DEFAULT_STRATEGY), "unavailable") == before + 1


def test_healthz_answers_while_triton_is_down(client):
    response = client.get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_readyz_is_503_within_a_second_when_triton_is_down(client):
    started = time.perf_counter()
    response = client.get("/readyz")
    assert time.perf_counter() - started < 1.0
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"


def _scraped(text: str, sample: str) -> float:
    """The value of one sample line (name and labels exactly as Prometheus prints them) in /metrics."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample + " ")]
    return values[0] if values else 0.0


def test_metrics_count_each_request_in_prometheus_format(client):
    sample = 'keyrank_requests_total{endpoint="/rerank",model="-",outcome="invalid",strategy="-"}'
    before = _scraped(client.get("/metrics").text, sample)
    client.post("/rerank", json={**OK, "top_n": 0})
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    assert _scraped(response.text, sample) == before + 1  # counted once, not merely declared
    for name in ("keyrank_in_flight_requests", "keyrank_queued_sequences", "keyrank_drain_sequences_per_second"):
        assert f"\n{name} " in response.text


def test_openapi_documents_the_rerank_routes_and_the_limits(client):
    spec = client.get("/openapi.json").json()
    for path in ("/rerank", "/v1/rerank", "/v2/rerank", "/tei/rerank", "/infinity/rerank"):
        assert "post" in spec["paths"][path]
    for path in ("/v1/models", "/tei/info", "/infinity/models"):
        assert "get" in spec["paths"][path]
    documents = spec["components"]["schemas"]["RerankRequest"]["properties"]["documents"]
    assert "KEYRANK_MAX_DOCUMENTS" in documents["description"]
    assert spec["components"]["schemas"]["RerankRequest"]["additionalProperties"] is False
    assert client.get("/docs").status_code == 200


COVERAGE = ("truncated", "read_tokens", "document_tokens")


def test_openapi_documents_coverage_on_every_result_and_evidence_as_opt_in_on_the_vendor_routes(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    native = schemas["RerankResult"]
    assert set(COVERAGE) <= set(native["required"])
    assert "whole document" in native["properties"]["truncated"]["description"]
    assert "keyb2" in native["properties"]["read_tokens"]["description"]
    assert "before max_tokens_per_doc" in native["properties"]["document_tokens"]["description"]
    for result in ("VendorResult", "TeiRank", "InfinityResult"):
        properties = schemas[result]["properties"]
        for name in ("evidence", *COVERAGE):
            assert "return_evidence" in properties[name]["description"], (result, name)
        assert not set(schemas[result].get("required", [])) & {"evidence", *COVERAGE}  # absent unless asked
    for request in ("V1RerankRequest", "CohereRerankRequest", "TeiRerankRequest", "InfinityRerankRequest"):
        field = schemas[request]["properties"]["return_evidence"]
        assert field["default"] is False and "extension" in field["description"], request


def test_request_id_is_echoed_or_generated(client):
    assert client.get("/healthz", headers={"X-Request-ID": "trace-123"}).headers["x-request-id"] == "trace-123"
    generated = client.get("/healthz", headers={"X-Request-ID": "bad id\twith spaces"}).headers["x-request-id"]
    assert generated != "bad id\twith spaces" and len(generated) == 32


def test_unknown_route_answers_in_the_error_shape(client):
    response = client.get("/v3/rerank")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_without_the_configured_api_key_is_401(keyed_client, path):
    body = {**OK, "model": "m"} if path == "/v2/rerank" else OK
    missing = keyed_client.post(path, json=body)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert "API key" in missing.json()["error"]["message"]
    wrong = keyed_client.post(path, json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert "invalid_token" in wrong.headers["www-authenticate"]


def test_the_right_api_key_gets_through_to_scoring(keyed_client):
    response = keyed_client.post("/rerank", json=OK, headers={"Authorization": "Bearer s3cret"})
    assert response.status_code == 503  # past auth and validation; only the dead Triton stops it


def test_probes_and_metrics_need_no_api_key(keyed_client):
    assert keyed_client.get("/healthz").status_code == 200
    assert keyed_client.get("/readyz").status_code == 503
    assert keyed_client.get("/metrics").status_code == 200


def test_error_bodies_are_json_objects_with_type_and_message(client):
    response = client.post("/rerank", content=b"nope", headers={"content-type": "application/json"})
    error = json.loads(response.text)["error"]
    assert set(error) >= {"type", "message", "request_id"}
    assert error["type"] == "invalid_json"


# --------------------------------------------------------------------------- answers from a live Triton

CATS = {
    "query": "what is a cat",
    "documents": [
        {"id": "market", "text": "The stock market fell sharply on Monday. Investors sold bank shares."},
        {"id": "cat", "text": "A cat is an animal. Cats are small carnivorous mammals kept as pets."},
        "Paris is the capital of France.",
    ],
}


@pytest.fixture(scope="module")
def live_client(prepared_models, embedded_triton):
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url)
    with TestClient(create_app(settings)) as c:
        yield c


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@pytest.mark.triton
def test_readyz_is_200_when_the_model_is_loaded(live_client):
    assert live_client.get("/readyz").status_code == 200


@pytest.mark.triton
def test_rerank_answer_is_ranked_with_ids_evidence_usage_and_timings(live_client):
    response = live_client.post("/rerank", json={**CATS, "return_documents": True})
    assert response.status_code == 200, response.text
    answer = RerankResponse.model_validate(response.json())
    texts = [d if isinstance(d, str) else d["text"] for d in CATS["documents"]]
    assert (answer.strategy, answer.selector) == (DEFAULT_STRATEGY, "bm25")
    assert answer.results[0].id == "cat"
    assert sorted(r.index for r in answer.results) == [0, 1, 2]
    scores = [r.relevance_score for r in answer.results]
    assert scores == sorted(scores, reverse=True)
    for result in answer.results:
        assert result.document.text == texts[result.index]
        assert result.evidence
        for span in result.evidence:
            assert span.text == texts[result.index][span.start : span.end]
    assert answer.usage.scored_sequences == 3 and answer.usage.scored_tokens > answer.usage.query_tokens
    server_timing = dict(part.split(";dur=") for part in response.headers["server-timing"].split(", "))
    assert {"tokenize", "segment", "select", "infer", "aggregate", "total"} <= set(server_timing)
    assert float(server_timing["total"]) == pytest.approx(answer.timings_ms.total, abs=1e-3)


@pytest.mark.triton
def test_rerank_leaves_out_what_was_not_asked_for(live_client):
    response = live_client.post("/rerank", json={**CATS, "strategy": "maxp", "top_n": 1, "return_evidence": False})
    body = response.json()
    assert (body["strategy"], body["selector"]) == ("maxp", None)
    assert len(body["results"]) == 1
    assert "evidence" not in body["results"][0] and "document" not in body["results"][0]


@pytest.mark.triton
def test_firstp_over_http_reproduces_the_reference_score(live_client):
    body = {"query": "what is a cat", "documents": ["a cat is an animal"], "strategy": "firstp"}
    response = live_client.post("/rerank", json=body)
    assert response.json()["results"][0]["relevance_score"] == pytest.approx(3.9349, abs=1e-3)


@pytest.mark.triton
def test_jina_endpoint_answers_in_jina_shape_with_the_same_order(live_client):
    own = live_client.post("/rerank", json=CATS).json()
    jina_docs = [d if isinstance(d, str) else {"text": d["text"]} for d in CATS["documents"]]
    request = {"model": "jina-reranker-v2-base-multilingual", "query": CATS["query"], "documents": jina_docs, "top_n": 2}
    response = live_client.post("/v1/rerank", json=request)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"id", "model", "usage", "results", "meta"}  # Jina's fields and Cohere v1's
    assert body["model"] == own["model"] == "ce-minilm-l6"
    assert body["meta"]["api_version"] == {"version": "1"}
    assert body["usage"]["total_tokens"] == own["usage"]["scored_tokens"]
    assert [r["index"] for r in body["results"]] == [r["index"] for r in own["results"]][:2]
    for mine, theirs in zip(own["results"], body["results"]):
        assert theirs["relevance_score"] == pytest.approx(_sigmoid(mine["relevance_score"]), rel=1e-6)
        assert set(theirs) == {"index", "relevance_score", "document"}  # Jina returns documents by default


@pytest.mark.triton
def test_cohere_endpoint_answers_in_cohere_v2_shape_with_the_same_order(live_client):
    own = live_client.post("/rerank", json=CATS).json()
    texts = [d if isinstance(d, str) else d["text"] for d in CATS["documents"]]
    request = {"model": "rerank-v3.5", "query": CATS["query"], "documents": texts}
    response = live_client.post("/v2/rerank", json=request, headers={"X-Request-ID": "cohere-1"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"id", "results", "meta"}
    assert body["id"] == "cohere-1"
    assert body["meta"] == {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}
    assert [r["index"] for r in body["results"]] == [r["index"] for r in own["results"]]
    for mine, theirs in zip(own["results"], body["results"]):
        assert set(theirs) == {"index", "relevance_score"}
        assert theirs["relevance_score"] == pytest.approx(_sigmoid(mine["relevance_score"]), rel=1e-6)
