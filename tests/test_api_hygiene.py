"""Input and protocol hygiene: auth before the body, vendor error shapes, no internal addresses,
limits in the OpenAPI schema, docs without a CDN, blank documents ranked last, the served model's name."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from keyrank.api import create_app
from keyrank.blank import BLANK_DOCUMENT_SCORE
from keyrank.config import Settings
from keyrank.schemas.common import NON_BLANK

DEAD_TRITON = "127.0.0.1:1"
OK = {"query": "what is a cat", "documents": ["a cat is an animal", "the stock market fell"]}
BODIES = {"/rerank": OK, "/v1/rerank": OK, "/v2/rerank": {**OK, "model": "rerank-v3.5"}}
LIMITS = {"max_documents": 5, "max_document_chars": 2_000, "max_query_chars": 200}


@pytest.fixture(scope="module")
def dead_client(prepared_models):
    settings = Settings(model_dir=prepared_models, triton_url=DEAD_TRITON, triton_connect_timeout_s=0.5, **LIMITS)
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture(scope="module")
def keyed_client(prepared_models):
    settings = Settings(model_dir=prepared_models, triton_url=DEAD_TRITON, api_key="s3cret")
    with TestClient(create_app(settings)) as c:
        yield c


# --------------------------------------------------------------------------- auth before the body


@pytest.mark.parametrize("path", list(BODIES))
def test_api_key_is_checked_before_the_body_is_read(keyed_client, path):
    read = []

    def body():
        read.append(True)
        yield b'{"query": "q", "documents": ["a"]}'

    response = keyed_client.post(path, content=body(), headers={"content-type": "application/json"})
    assert response.status_code == 401
    assert read == [], "the body was read before the API key was checked"


def test_broken_json_without_a_key_is_401_not_400(keyed_client):
    response = keyed_client.post("/rerank", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 401


def test_wrong_scheme_is_not_taken_for_a_key(keyed_client):
    response = keyed_client.post("/rerank", json=OK, headers={"Authorization": "Basic s3cret"})
    assert response.status_code == 401


# --------------------------------------------------------------------------- vendor error shapes


def test_each_route_answers_errors_in_its_vendors_shape(dead_client):
    bad = {"query": " ", "documents": ["a"], "model": "m"}
    native = dead_client.post("/rerank", json={k: v for k, v in bad.items() if k != "model"}).json()
    assert set(native) == {"error"} and "query" in native["error"]["message"]
    jina = dead_client.post("/v1/rerank", json=bad).json()
    assert "query" in jina["detail"] and jina["message"] == jina["detail"]  # Jina reads detail, Cohere v1 message
    cohere = dead_client.post("/v2/rerank", json=bad, headers={"X-Request-ID": "c-1"}).json()
    assert "query" in cohere["message"] and cohere["id"] == "c-1"


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_unauthorized_is_in_the_vendors_shape_too(keyed_client, path):
    body = keyed_client.post(path, json=BODIES[path]).json()
    assert "API key" in body["message"]
    assert path != "/v1/rerank" or "API key" in body["detail"]


# --------------------------------------------------------------------------- nothing internal leaks

INTERNAL = re.compile(r"127\.0\.0\.1|ipv4|localhost|:\d{2,5}\b|/work/|models/|Traceback")


@pytest.mark.parametrize("path", list(BODIES))
def test_503_names_no_internal_address(dead_client, path):
    response = dead_client.post(path, json=BODIES[path])
    assert response.status_code == 503
    assert not INTERNAL.search(response.text), response.text
    assert "retry after" in response.text


def test_readyz_503_names_no_internal_address(dead_client):
    response = dead_client.get("/readyz")
    assert response.status_code == 503 and not INTERNAL.search(response.text)


# --------------------------------------------------------------------------- OpenAPI limits


@pytest.mark.parametrize("name", ["RerankRequest", "V1RerankRequest", "CohereRerankRequest"])
def test_openapi_carries_the_configured_limits(dead_client, name):
    schemas = dead_client.get("/openapi.json").json()["components"]["schemas"]
    properties = schemas[name]["properties"]
    assert properties["query"]["maxLength"] == 200
    assert properties["query"]["pattern"] == NON_BLANK  # not \S: ECMA's and Python's whitespace differ
    assert properties["documents"]["maxItems"] == 5
    strings = [m for m in properties["documents"]["items"]["anyOf"] if m.get("type") == "string"]
    assert strings == [{"type": "string", "maxLength": 2_000}]
    if name == "RerankRequest":
        assert schemas["DocumentIn"]["properties"]["text"]["maxLength"] == 2_000


def test_openapi_offers_only_the_strategies_this_deployment_can_run(dead_client):
    request = dead_client.get("/openapi.json").json()["components"]["schemas"]["RerankRequest"]
    offered = next(m["enum"] for m in request["properties"]["strategy"]["anyOf"] if "enum" in m)
    assert {"firstp", "maxp", "keyb2"} <= set(offered)
    assert "parade-transformer" not in offered  # no trained aggregator in the prepared models
    refused = dead_client.post("/rerank", json={**OK, "strategy": "parade-transformer"})
    assert refused.status_code == 422 and "keyrank finetune" in refused.json()["error"]["message"]


def test_openapi_documents_429_and_the_vendor_error_bodies(dead_client):
    paths = dead_client.get("/openapi.json").json()["paths"]
    for path, body in (("/rerank", "ErrorResponse"), ("/v1/rerank", "V1ErrorResponse"), ("/v2/rerank", "CohereErrorResponse")):
        responses = paths[path]["post"]["responses"]
        assert {"400", "401", "413", "422", "429", "503"} <= set(responses)
        assert responses["422"]["content"]["application/json"]["schema"]["$ref"].endswith(body)


# --------------------------------------------------------------------------- docs without internet


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_every_asset_from_the_gateway(dead_client, page):
    html = dead_client.get(page).text
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html) + re.findall(r"url: *'([^']+)'", html)
    assert urls, html
    for url in urls:
        assert url.startswith("/"), f"{page} loads {url} from elsewhere"
        asset = dead_client.get(url)
        assert asset.status_code == 200, url
    scripts = [u for u in urls if u.endswith(".js")]
    assert scripts and all(len(dead_client.get(u).content) > 100_000 for u in scripts)  # the real bundles


# --------------------------------------------------------------------------- live: blank documents, model name

DOCS = ["", "A cat is a small carnivorous mammal kept as a pet.", "  \n\t ", "The stock market fell on Monday."]


@pytest.fixture(scope="module")
def live_client(prepared_models, embedded_triton):
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url)
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.mark.triton
@pytest.mark.parametrize("strategy", ["firstp", "maxp", "keyb2"])
def test_blank_documents_rank_last_below_an_irrelevant_document(live_client, strategy):
    response = live_client.post("/rerank", json={"query": "what is a cat", "documents": DOCS, "strategy": strategy})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["index"] for r in results] == [1, 3, 0, 2]
    assert [r["relevance_score"] for r in results[2:]] == [BLANK_DOCUMENT_SCORE] * 2
    assert results[1]["relevance_score"] > BLANK_DOCUMENT_SCORE
    assert results[2]["evidence"] == [] and results[3]["evidence"] == []


@pytest.mark.triton
def test_top_n_is_cut_after_blank_documents_moved_last(live_client):
    body = {"query": "what is a cat", "documents": DOCS, "top_n": 3}
    assert [r["index"] for r in live_client.post("/rerank", json=body).json()["results"]] == [1, 3, 0]
    vendor = live_client.post("/v1/rerank", json=body).json()["results"]
    assert [r["index"] for r in vendor] == [1, 3, 0] and vendor[2]["relevance_score"] == 0.0


@pytest.mark.triton
def test_only_blank_documents_are_answered_not_refused(live_client):
    response = live_client.post("/rerank", json={"query": "cats", "documents": ["", " "]})
    assert response.status_code == 200
    assert [r["index"] for r in response.json()["results"]] == [0, 1]


@pytest.mark.triton
def test_model_is_the_configured_name(prepared_models, embedded_triton):
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url, model_name="acme-rerank-1")
    with TestClient(create_app(settings)) as client:
        assert client.post("/rerank", json=OK).json()["model"] == "acme-rerank-1"
        response = client.post("/v1/rerank", json={**OK, "model": "acme-rerank-1"})
        assert response.json()["model"] == "acme-rerank-1"
        assert "x-keyrank-ignored-fields" not in response.headers  # the served model is not "ignored"


# --------------------------------------------------------------------------- a trickling body


def test_a_body_that_never_finishes_is_answered_408_after_the_read_timeout(prepared_models):
    import socket
    import time

    from live_gateway import live_gateway

    settings = Settings(model_dir=prepared_models, triton_url=DEAD_TRITON, body_read_timeout_s=1.0)
    with live_gateway(settings) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            started = time.monotonic()
            conn.sendall(b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"query\": ")  # 10 of the 100 bytes, then silence
            answer = conn.recv(4096).decode()
            waited = time.monotonic() - started
    assert answer.startswith("HTTP/1.1 408"), answer
    assert "KEYRANK_BODY_READ_TIMEOUT_S" in answer
    assert 0.9 < waited < 3.0
