"""A client that never finishes its request headers is disconnected (slow-loris), while
a normal request and a kept-alive connection are served as before."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn
from keyrank.api.http_protocol import protocol_with_timeout


async def _ok(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_ok, host="127.0.0.1", port=port, log_level="error", http=protocol_with_timeout(1.0)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(timeout=5)


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    sock.settimeout(seconds)
    started = time.monotonic()
    try:
        while sock.recv(1024):
            pass
    except socket.timeout:
        return None
    return time.monotonic() - started


def test_half_sent_headers_are_cut_off_after_the_timeout(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /rerank HTTP/1.1\r\nHost: x\r\n")  # never finished
        took = _closed_within(sock, 5)
    assert took is not None and took < 3


def test_a_complete_request_and_a_second_one_on_the_same_connection_are_served(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        for _ in range(2):
            time.sleep(0.6)  # each wait alone is under the timeout; together they are over it
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")


def test_the_timer_rearms_for_the_next_request_on_a_kept_alive_connection(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET / HTTP/1.1\r\nHo")  # the second request stalls
        took = _closed_within(sock, 5)
    assert took is not None and took < 3
