"""Hostile input: lone surrogates, invisible documents, JSON that Python's parser takes
and JSON does not, bodies nested 100,000 deep, unknown field names of any size. None is a 5xx;
each 4xx names the problem; the connection keeps answering after it.

The first tests need no model (a dead Triton: they are refused before scoring); the rest run on
a live gateway over the session's Triton. ``test_10000_hostile_requests_get_no_server_error`` is
the long run (``-m slow``).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from keyrank.api import create_app
from keyrank.blank import BLANK_DOCUMENT_SCORE, is_blank
from keyrank.config import Settings
from keyrank.schemas.common import NON_BLANK
from live_gateway import live_gateway

DEAD_TRITON = "127.0.0.1:1"
ROUTES = ("/rerank", "/v1/rerank", "/v2/rerank")
JSON = {"content-type": "application/json"}


def _too_deep_by_every_byte(body: bytes):
    """The depth check as first written: strings blanked, the depth after every byte (the reference)."""
    import numpy as np
    from keyrank.api.body import _STRING, MAX_DEPTH

    codes = np.frombuffer(_STRING.sub(lambda m: b" " * len(m.group()), body), dtype=np.uint8)
    depth = np.cumsum(np.isin(codes, (ord("["), ord("{"))).astype(np.int64) - np.isin(codes, (ord("]"), ord("}"))))
    over = np.flatnonzero(depth > MAX_DEPTH)
    return int(over[0]) if over.size else None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b'\\"', b"a", b"{vocalsound}", b'"[[{"', b"[" * 30]),
                max_size=200))
def test_the_depth_check_finds_the_bracket_every_byte_does(parts):
    """Brackets inside strings, escaped quotes, unterminated strings: the bracket walk names the same offset."""
    from keyrank.api.body import _too_deep

    body = b"".join(parts)
    assert _too_deep(body) == _too_deep_by_every_byte(body)


@pytest.mark.parametrize("depth", [1, 62, 63, 64, 999, 5_000])
@pytest.mark.parametrize("shape", ["arrays", "objects"])
def test_a_body_is_refused_past_64_levels_at_the_bracket_that_opens_the_65th(depth, shape):
    """Checked on the parsed value (or at the parser's own recursion limit) and placed by the bracket walk; text
    full of brackets inside strings does not count. The body's own object is level 1, so ``depth`` nested
    containers under it make depth + 1 levels."""
    from keyrank.api.body import InvalidJson, parse_json

    opener, closer = (b'{"a":', b"}") if shape == "objects" else (b"[", b"]")
    head = b'{"query": "[{[{", "documents": ["{vocalsound} [x]", "' + b"[" * 200 + b'"], "x": '
    body = head + opener * depth + b"1" + closer * depth + b"}"
    if depth + 1 <= 64:
        assert parse_json(body)["documents"][0] == "{vocalsound} [x]"
        return
    with pytest.raises(InvalidJson, match="nested deeper than 64") as refused:
        parse_json(body)
    column = len(head) + 63 * len(opener) + 1  # the 64th nested opener is level 65
    assert str(refused.value).endswith(f"at line 1, column {column}"), str(refused.value)


def _body(path: str, query: str, documents: list, **extra) -> dict:
    """A request in ``path``'s shape (/v2 needs a model)."""
    return {**({"model": "rerank-v3.5"} if path == "/v2/rerank" else {}), "query": query, "documents": documents, **extra}


def _raw(value: object) -> bytes:
    """JSON as a client with Python's defaults writes it: lone surrogates as \\ud800 escapes, NaN as NaN."""
    return json.dumps(value, ensure_ascii=True, allow_nan=True).encode()


def _message(response: httpx.Response) -> str:
    body = response.json()
    return body["error"]["message"]


@pytest.fixture(scope="module")
def dead_client(prepared_models):
    settings = Settings(model_dir=prepared_models, triton_url=DEAD_TRITON, triton_connect_timeout_s=0.5)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def test_the_blank_document_pattern_is_built_at_start_not_by_the_first_request(prepared_models):
    """Building it reads every Unicode code point (~0.4 s): the gateway's start pays that, no request does."""
    from keyrank import blank

    blank._readable_character.cache_clear()
    app = create_app(Settings(model_dir=prepared_models, triton_url=DEAD_TRITON, triton_connect_timeout_s=0.5))
    assert blank._readable_character.cache_info().currsize == 0
    with TestClient(app):
        assert blank._readable_character.cache_info().currsize == 1


# --------------------------------------------------------------------------- lone surrogates: 422 naming the field


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize(
    ("where", "field"),
    [("document", "documents[0]"), ("query", "query"), ("object-document", "documents[0].text")],
)
def test_a_lone_surrogate_is_a_422_naming_the_field_on_every_route(dead_client, path, where, field):
    query, documents = ("q\ud800" if where == "query" else "q"), ["a\ud800b"] if where == "document" else ["ab"]
    if where == "object-document":
        documents = [{"id": "x", "text": "a\ud800b"}] if path == "/rerank" else [{"text": "a\ud800b"}]
    response = dead_client.post(path, content=_raw(_body(path, query, documents)), headers=JSON)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert "lone surrogate U+D800 at character 1" in _message(response)


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_a_lone_surrogate_in_an_extra_field_or_a_field_name_is_a_422_not_a_500(dead_client, path):
    value = _raw(_body(path, "q", [{"text": "a", "note": "x\udfff"}], return_documents=True))
    response = dead_client.post(path, content=value, headers=JSON)
    assert response.status_code == 422 and response.json()["error"]["field"] == "documents[0].note"
    name = _raw(_body(path, "q", ["a"], **{"k\ud800": 1}))
    response = dead_client.post(path, content=name, headers=JSON)
    assert response.status_code == 422
    assert "a field name holds lone surrogate" in _message(response)
    assert "Content-Type" not in _message(response)  # it was blamed on the content type


# --------------------------------------------------------------------------- parse errors name the problem

DEEP_ARRAYS = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECTS = b'{"a":' * 5_000 + b"1" + b"}" * 5_000
HUGE_INT = b'{"query": "q", "documents": ["a"], "top_n": ' + b"9" * 5_000 + b"}"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        pytest.param(b'{"query": "q", "documents": ["\xff\xfe"]}', ["not UTF-8", "0xff", "line 1, column 31"], id="invalid-utf8"),
        pytest.param(DEEP_ARRAYS, ["nested deeper than 64", "line 1, column 65"], id="arrays-100000-deep"),
        pytest.param(DEEP_OBJECTS, ["nested deeper than 64", "line 1, column 321"], id="objects-5000-deep"),
        pytest.param(b'{"query": "q",\n "documents": ["a"], "top_n": NaN}', ["NaN is not a JSON value", "line 2, column 31"], id="nan"),
        pytest.param(b'{"query": "q", "documents": ["a"], "x": -Infinity}', ["-Infinity", "column 41"], id="minus-infinity"),
        pytest.param(b'{"query": "q", "documents": ["a"], "x": 1e999}', ["1e999", "out of range", "column 41"], id="float-overflow"),
        pytest.param(HUGE_INT, ["integer of 5000 digits"], id="huge-integer"),
        pytest.param(b'{"query": "q", "documents": ["a"], "query": "r"}', ['duplicate key "query"'], id="duplicate-key"),
    ],
)
@pytest.mark.parametrize("path", ROUTES)
def test_a_body_that_is_not_json_is_a_400_naming_the_problem_and_where(dead_client, path, body, words):
    response = dead_client.post(path, content=body, headers=JSON)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_json"
    message = _message(response)
    assert "There was an error parsing the body" not in message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("path", ROUTES)
def test_a_compressed_body_is_a_415_naming_the_content_encoding(dead_client, path):
    import gzip

    body = gzip.compress(_raw(_body(path, "q", ["a"])))
    response = dead_client.post(path, content=body, headers={**JSON, "content-encoding": "gzip"})
    assert response.status_code == 415
    assert "Content-Encoding 'gzip'" in _message(response) and "uncompressed" in _message(response)


# --------------------------------------------------------------------------- schema and validator agree

# Queries that once failed tests/test_schemathesis.py at random: the schema's \S took them, the server did not.
SCHEMATHESIS_FINDINGS = ["\u001f", "\u001e", "\u001c\u001d", "\u0085", "\ufeff"]
# Queries the model would read nothing of (they once got 200 with query_tokens 0): NUL, controls, combining
# marks, zero-width and bidi characters, a Hangul filler.
NOTHING_TO_READ = ["\x00", "\x00\x01\x07\x7f", "\u0301\u0302", "\u200b\u2060", "\u200f\u202e", "\u3164"]


@pytest.mark.parametrize("query", SCHEMATHESIS_FINDINGS + NOTHING_TO_READ + [" \t\n", "\u3000\u2028"])
@pytest.mark.parametrize("path", ROUTES)
def test_a_query_the_schema_calls_blank_is_refused_and_one_it_takes_is_not(dead_client, path, query):
    schema = dead_client.get("/openapi.json").json()["components"]["schemas"]
    name = {"/rerank": "RerankRequest", "/v1/rerank": "V1RerankRequest", "/v2/rerank": "CohereRerankRequest"}[path]
    pattern = schema[name]["properties"]["query"]["pattern"]
    # Spelled out, not \S: ECMA's \S (the schema's engine) takes "\u001f", Python's str.strip does not.
    assert pattern == NON_BLANK and "\\S" not in pattern and "\\s" not in pattern
    assert re.search(pattern, query) is None
    response = dead_client.post(path, json=_body(path, query, ["a"]))
    assert response.status_code == 422 and "non-whitespace" in _message(response)
    taken = dead_client.post(path, json=_body(path, query + "q", ["a"]))
    assert taken.status_code == 503  # past validation, on to the (dead) scorer


@pytest.mark.parametrize("query", NOTHING_TO_READ + ["   "])
def test_the_python_api_refuses_a_query_with_nothing_to_read_as_the_routes_do(query):
    from keyrank.errors import InvalidRequest
    from keyrank.reranker import _check

    with pytest.raises(InvalidRequest, match="readable character"):
        _check(query, ["a document"])
    _check(query + "q", ["a document"])


def test_generated_tests_draw_the_same_examples_on_every_run():
    from hypothesis import settings as current

    assert current.default.derandomize and current.default.database is None


@pytest.mark.parametrize(
    "text", ["\u200b", "\u2060\u2060", "\u00ad", "\x01\x1f\x7f", "\u0301\u0302", "\ufeff", " \u3164 ", "\u200f\u202e", ""]
)
def test_text_with_nothing_to_read_is_blank(text):
    assert is_blank(text)


@pytest.mark.parametrize("text", ["a", "\u200bParis", "é", "\u0627\u0644", "😀", "\u00a0.", "ภาษาไทย"])
def test_text_with_a_readable_character_is_not_blank(text):
    assert not is_blank(text)


# --------------------------------------------------------------------------- live: blank documents never scored


@pytest.fixture(scope="module")
def live_client(prepared_models, embedded_triton):
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url)
    with TestClient(create_app(settings)) as c:
        yield c


INVISIBLE = ["\u200b", "\u2060", "\u00ad\u00ad", "\x00\x07", "\u0301", ""]
FRANCE = "what is the capital of France"
BERLIN = "Berlin is the capital of Germany."


@pytest.mark.triton
@pytest.mark.parametrize("invisible", INVISIBLE)
def test_an_invisible_document_ranks_after_a_real_one_and_is_never_scored(live_client, invisible):
    reranker = live_client.app.state.reranker
    scored: list[list[str]] = []  # what the pipeline tokenizes and the model scores
    start = reranker.pipeline.start

    def recording(query, documents, *args):
        scored.append(list(documents))
        return start(query, documents, *args)

    reranker.pipeline.start = recording
    try:
        response = live_client.post("/rerank", json={"query": FRANCE, "documents": [invisible, BERLIN]})
    finally:
        del reranker.pipeline.start
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["index"] for r in results] == [1, 0]
    assert results[1]["relevance_score"] == BLANK_DOCUMENT_SCORE and results[1]["evidence"] == []
    assert scored == [[BERLIN]]


@pytest.mark.triton
@pytest.mark.parametrize("path", ROUTES)
def test_1000_blank_documents_answer_fast(live_client, path):
    documents = [INVISIBLE[i % len(INVISIBLE)] for i in range(999)] + [BERLIN]
    started = time.monotonic()
    response = live_client.post(path, json=_body(path, FRANCE, documents, top_n=3))
    took = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert [r["index"] for r in response.json()["results"]] == [999, 0, 1]
    assert took < 2.0, f"{took:.1f} s for one readable document (11.4 s when blanks were scored)"
    only_blank = live_client.post(path, json=_body(path, FRANCE, documents[:999]))
    assert only_blank.status_code == 200 and len(only_blank.json()["results"]) == 999


# --------------------------------------------------------------------------- live: keep-alive after hostile input


@pytest.fixture(scope="module")
def gateway(prepared_models, embedded_triton):
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url)
    with live_gateway(settings) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client


def _local_port(response: httpx.Response) -> int:
    """The client's port: the same port means the same keep-alive connection."""
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


def _send_twice_on_one_connection(client: httpx.Client, path: str, body: bytes) -> httpx.Response:
    """``body``, then a plain request: both answered, on the same connection, neither a 5xx."""
    response = client.post(path, content=body, headers=JSON)
    assert response.status_code < 500, (path, body[:300], response.text)
    assert response.headers.get("connection", "").lower() != "close"
    after = client.post(path, json=_body(path, "q", ["a"]), headers=JSON)
    assert after.status_code == 200, after.text
    assert _local_port(after) == _local_port(response), "the connection was closed after the hostile request"
    return response


@pytest.mark.triton
@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
@pytest.mark.parametrize("value", [float("nan"), float("-inf"), "x\ud800y"], ids=["nan", "-inf", "surrogate"])
def test_an_echoed_object_document_with_a_hostile_extra_field_is_a_4xx_and_the_connection_lives(gateway, path, value):
    body = _raw(_body(path, "q", [{"text": "a cat", "extra": value}], return_documents=True))
    response = _send_twice_on_one_connection(gateway, path, body)
    assert response.status_code in (400, 422)


@pytest.mark.triton
@pytest.mark.parametrize("path", ROUTES)
def test_a_document_with_a_lone_surrogate_leaves_the_connection_answering(gateway, path):
    response = _send_twice_on_one_connection(gateway, path, _raw(_body(path, "q", ["a\ud800b"])))
    assert response.status_code == 422


@pytest.mark.triton
@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_the_ignored_fields_header_stays_small_whatever_the_names(gateway, path):
    names = {f"{i:02d}" + "x" * 20_000: 1 for i in range(40)}
    response = gateway.post(path, json=_body(path, "q", ["a"], **names))  # httpx refused the 640 KB header
    assert response.status_code == 200, response.text
    header = response.headers["x-keyrank-ignored-fields"]
    assert len(header) < 3_000
    named = header.split(", ")
    ignored = 40 + (path == "/v2/rerank")  # /v2's model names another model: ignored too
    assert len(named) == 33 and named[-1] == f"... ({ignored - 32} more)"
    assert all(len(n) <= 64 and n.endswith("...") for n in named[:32] if n != "model")


# --------------------------------------------------------------------------- property: hostile text and JSON

HOSTILE_CHARS = (
    "\ud800\udbff\udc00\udfff"  # lone surrogates (JSON-escaped on the wire)
    "\x00\x01\x07\x1b\x1c\x1f\x7f\x85"  # NUL and controls
    "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e"  # zero-width, word joiner, BOM, soft hyphen
    "\u0301\u0302\u20dd\u034f"  # combining marks alone
    "\u200e\u200f\u202a\u202b\u202e\u2066\u2069\u0627\u05d0"  # bidi controls, Arabic, Hebrew
    "\u2028\u2029\u3000\u3164 \t\n"  # separators, fillers
    "\U0001f600\U000e0041\ufffd[SEP]{}\"\\"
)
hostile_text = st.text(alphabet=st.sampled_from(HOSTILE_CHARS) | st.characters(codec="utf-8"), max_size=12)
json_leaf = st.one_of(
    hostile_text, st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3), max_leaves=6)
EDGE_LITERALS = [b"NaN", b"-Infinity", b"Infinity", b"1e999", b"-1e999", b"1e-999", b"9" * 5_000, b"-0", b"1E400"]


@st.composite
def hostile_request(draw) -> tuple[str, bytes]:
    """A route and a body: a request with hostile strings and values, or an edge of JSON itself."""
    path = draw(st.sampled_from(ROUTES))
    documents = draw(st.lists(hostile_text | st.fixed_dictionaries({"text": hostile_text}, optional={"meta": json_value}), min_size=1, max_size=3))
    if path == "/rerank":
        documents = [d if isinstance(d, str) else {"text": d["text"]} for d in documents]
    extra = draw(st.dictionaries(hostile_text, json_value, max_size=2)) if path != "/rerank" else {}
    body = {**extra, **_body(path, draw(hostile_text | st.just("cats")), documents)}  # a drawn "query" key is overwritten
    if path != "/rerank" and draw(st.booleans()):
        body["return_documents"] = True
    raw = _raw(body)
    edge = draw(st.sampled_from(["none", "literal", "deep", "duplicate", "bytes", "bom"]))
    if edge == "literal":
        raw = raw[:-1] + b', "x": ' + draw(st.sampled_from(EDGE_LITERALS)) + b"}"
    elif edge == "deep":
        depth = draw(st.sampled_from([60, 63, 64, 65, 1_000, 100_000]))
        raw = raw[:-1] + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
    elif edge == "duplicate":
        raw = raw[:-1] + b', "query": "again"}'
    elif edge == "bytes":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])) + raw[at:]
    elif edge == "bom":
        raw = b"\xef\xbb\xbf" + raw
    return path, raw


@pytest.mark.triton
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(hostile=hostile_request())
@example(hostile=("/v1/rerank", b'{"query": "q", "documents": [{"text": "a", "x": NaN}], "return_documents": true}'))
@example(hostile=("/v2/rerank", b'{"model": "m", "query": "q", "documents": ["\\ud800"]}'))
@example(hostile=("/rerank", b'{"query": "\\u001f", "documents": ["a"]}'))
def test_hostile_unicode_and_json_get_no_server_error_and_the_connection_answers_on(gateway, hostile):
    path, body = hostile
    _send_twice_on_one_connection(gateway, path, body)


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.timeout(1_500)
def test_10000_hostile_requests_get_no_server_error(gateway):
    """The long run: 10,000 hostile requests on one keep-alive connection to a gateway on 127.0.0.1
    (at most 20 minutes); prints the count of 5xx and of dropped connections."""
    assert gateway.base_url.host == "127.0.0.1"
    deadline = time.monotonic() + 1_200
    statuses: Counter[int] = Counter()
    server_errors: list[tuple[str, bytes, str]] = []
    ports: set[int] = set()

    @settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None, phases=[Phase.explicit, Phase.generate])
    @given(hostile=hostile_request())
    def send(hostile):
        if time.monotonic() > deadline:
            return
        path, body = hostile
        response = gateway.post(path, content=body, headers=JSON)
        statuses[response.status_code] += 1
        ports.add(_local_port(response))
        if response.status_code >= 500:
            server_errors.append((path, body[:200], response.text[:200]))

    started = time.monotonic()
    send()
    sent = sum(statuses.values())
    print(f"\n{sent} hostile requests in {time.monotonic() - started:.0f} s: {dict(sorted(statuses.items()))}; "
          f"5xx: {len(server_errors)}; connections used: {len(ports)}")
    assert sent >= 10_000 or time.monotonic() > deadline
    assert server_errors == [], server_errors[:5]
    assert len(ports) == 1, "a hostile request closed the keep-alive connection"


