"""Abusive clients cost the gateway little and still get a JSON answer: 8,000 unknown fields are refused at
once in a bounded answer; a body streamed on after a refusal closes the connection instead of being read;
headers past the limit get a JSON 431, however much more the client sends.

The raw-socket tests run the app on uvicorn with keyrank's own HTTP protocol, as ``keyrank serve`` does, and
a dead Triton: nothing here is ranked, so no model is needed.
"""

from __future__ import annotations

import json
import select
import socket
import time

import pytest
from fastapi.testclient import TestClient
from keyrank.api import create_app
from keyrank.api.http_protocol import protocol_with_timeout
from keyrank.config import Settings
from live_gateway import serving

DEAD_TRITON = "127.0.0.1:1"
KEY = "s3cret"


def _settings(model_dir, **extra) -> Settings:
    return Settings(model_dir=model_dir, triton_url=DEAD_TRITON, **extra)


# --------------------------------------------------------------------------- unknown fields


def test_8000_unknown_fields_get_a_422_at_once_in_a_bounded_answer(tmp_path):
    client = TestClient(create_app(_settings(tmp_path)))  # refused before any model is needed
    body = {"query": "q", "documents": ["a"], **{f"field{i:05d}": 1 for i in range(8_000)}}
    started = time.monotonic()
    response = client.post("/rerank", json=body)
    took = time.monotonic() - started
    assert response.status_code == 422
    assert took < 1.0, f"{took:.1f} s"  # was 15 s, the event loop held all along
    assert len(response.content) < 4_000  # was 551 KB for a 95 KB body
    error = response.json()["error"]
    assert error["message"].startswith("field00000: unknown field; field00001: unknown field")
    assert len(error["details"]) == 20 and error["details_omitted"] == 7_980


def test_an_unknown_field_name_of_any_length_is_echoed_cut(tmp_path):
    client = TestClient(create_app(_settings(tmp_path)))
    response = client.post("/rerank", json={"query": "q", "documents": ["a"], "x" * 100_000: 1})
    assert response.status_code == 422 and len(response.content) < 1_000
    assert response.json()["error"]["field"] == "x" * 125 + "..."


# --------------------------------------------------------------------------- raw sockets on keyrank's protocol


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    app = create_app(_settings(tmp_path_factory.mktemp("models"), api_key=KEY))
    with serving(app, lifespan="off", http=protocol_with_timeout(10.0)) as url:
        yield int(url.rsplit(":", 1)[1])


def _read_answer(sock: socket.socket, seconds: float = 5.0) -> tuple[bytes, dict[str, str], bytes]:
    """Status line, headers and body of the answer on ``sock``, read until the server closes."""
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.decode().lower(): v.decode().strip() for k, _, v in (line.partition(b":") for line in lines)}
    return status, headers, body


REFUSED_BEFORE_THE_BODY = {
    "401 without the key": (b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n", b"401"),
    "413 by Content-Length": (b"POST /rerank HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                              b"\r\nContent-Type: application/json\r\nContent-Length: 999999999999\r\n\r\n", b"413"),
    "404 on no route": (b"POST /nothing HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", b"404"),
}


@pytest.mark.parametrize("case", REFUSED_BEFORE_THE_BODY)
def test_a_body_streamed_on_after_a_refusal_is_not_read_the_connection_closes(port, case):
    head, status = REFUSED_BEFORE_THE_BODY[case]
    chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n" if b"chunked" in head else b"x" * 0x4000
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head + chunk)
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 " + status) and b"connection: close" in answer.lower(), answer
        started = time.monotonic()
        closed_after = None
        while closed_after is None and time.monotonic() - started < 5:  # the server used to read on for 10 s
            try:
                sock.sendall(chunk)  # whole chunks: a broken one would be refused for its framing instead
                if select.select([sock], [], [], 0.05)[0] and sock.recv(65536) == b"":
                    closed_after = time.monotonic() - started
            except OSError:  # reset, broken pipe: closed
                closed_after = time.monotonic() - started
    assert closed_after is not None and closed_after < 2.0


@pytest.mark.parametrize("size", [200_000, 8_000_000])
def test_headers_past_the_limit_get_a_json_431_naming_it(port, size):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n")  # was reset at 8 MB
        status, headers, body = _read_answer(sock)
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["type"] == "headers_too_large" and "16384 bytes" in error["message"]
    assert error["request_id"] == headers["x-request-id"]


def test_a_malformed_request_line_gets_a_json_400(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"NOT AN HTTP REQUEST\r\n\r\n")
        status, headers, body = _read_answer(sock)
    assert status == b"HTTP/1.1 400 Bad Request" and headers["content-type"] == "application/json"
    assert json.loads(body)["error"] == {"type": "bad_request", "message": "invalid HTTP request: illegal request line",
                                         "request_id": headers["x-request-id"]}


def test_a_refused_connection_is_closed_after_lingering_even_if_the_client_never_stops(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000)
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 6:
            try:
                sock.sendall(b"a" * 0x4000)  # the header line never ends
            except OSError:  # reset, broken pipe: closed
                closed = True
    assert closed and time.monotonic() - started < 4


# --------------------------------------------------------------------------- Retry-After past the keep-alive


def test_a_retry_after_past_the_keep_alive_closes_the_connection_and_the_retry_gets_a_new_one(prepared_models):
    import httpx

    # A dead Triton: these requests are refused at the door, before scoring.
    app = create_app(_settings(prepared_models, keep_alive_s=5.0, max_queued_sequences=4, capacity_sequences_per_s=4.0))
    with serving(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        queue = app.state.admission
        queue.small_depth = queue.small_reserve  # small requests' reserve full too
        queue.depth = queue.rate * 11  # 11 s of queued work: Retry-After 11, past the 5 s keep-alive
        refused = client.post("/rerank", json={"query": "q", "documents": ["a"]})
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 5
        assert refused.headers["connection"] == "close"  # the client knows to reconnect when it retries
        queue.depth = queue.rate * 2  # a short wait: the connection is worth keeping
        short = client.post("/rerank", json={"query": "q", "documents": ["a"]})
        assert short.status_code == 429 and short.headers["retry-after"] == "2"
        assert "connection" not in short.headers or short.headers["connection"] != "close"
        queue.depth = queue.small_depth = 0
