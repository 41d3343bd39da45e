"""uvicorn's h11 protocol with a header read timeout, and JSON refusals of requests it cannot parse.

uvicorn closes idle keep-alive connections but waits forever for the headers of
a request that has begun: a client that sends half a request line holds a
connection (and a file descriptor) open indefinitely, which is how slow-loris
clients exhaust a server. Here a request's headers must be complete within
``header_timeout_s`` of the connection opening or of the previous response;
otherwise the connection is closed (the body has its own timeout, api/middleware).

A request h11 refuses before the app sees it (headers past h11's limit, a
malformed request line) got uvicorn's plain-text ``400 Invalid HTTP request
received.``, and a client still sending was reset before it could read even
that. Here it gets keyrank's JSON error (431 naming the limit, or 400), and
what it still sends is read and dropped for ``linger_s`` so that it can.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from typing import Any

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol
from uvicorn.server import ServerState

log = logging.getLogger("keyrank.api")

_MAX_REASON_CHARS = 120
"""h11's reason for refusing a request is cut to this many characters in the answer (and to the words before
the bytes it quotes)."""


class _RefusingConnection(h11.Connection):
    """h11's server connection, keeping the error it refused the request with (its status hint: 431 when the
    request line and headers outgrew the limit, else 400)."""

    refusal: h11.RemoteProtocolError | None = None
    """The error of the last refused request."""

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refusal = exc
            raise


class HeaderTimeoutH11Protocol(H11Protocol):
    """``H11Protocol`` that closes a connection whose request headers do not arrive in time, and refuses one it
    cannot parse in JSON."""

    header_timeout_s: float = float(os.environ.get("KEYRANK_HEADER_READ_TIMEOUT_S", "10"))
    """Seconds a request's line and headers may take (class attribute: uvicorn builds the protocol). Read from
    the environment when the module loads, so ``keyrank serve --workers N`` can name this class by its
    import path (``HTTP_PROTOCOL``) for worker processes, which cannot be handed a class made at run time."""
    linger_s: float = 2.0
    """Seconds a refused connection is read (and what comes dropped) before it is closed, unless the client
    closes first: closing with unread data resets the connection, and a client still sending its headers
    would lose the answer."""

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # uvicorn's limit (h11_max_incomplete_event_size), named in the 431.
        self.max_head_bytes = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        self.conn = _RefusingConnection(h11.SERVER, self.max_head_bytes)
        self._refused = False

    def send_400_response(self, msg: str) -> None:
        """keyrank's JSON error for a request h11 refused (uvicorn's is plain text), then a lingering close."""
        refusal = self.conn.refusal
        status = refusal.error_status_hint if refusal is not None else 400
        if status == 431:
            kind = "headers_too_large"
            message = f"request line and headers exceed {self.max_head_bytes} bytes; send fewer or shorter headers"
        else:
            reason = str(refusal or msg).partition(": ")[0][:_MAX_REASON_CHARS]  # "illegal request line: bytearray(...)"
            kind, message = "bad_request", f"invalid HTTP request: {reason}"
        request_id = uuid.uuid4().hex
        log.info("refused a request before its headers were read, request_id=%s: %s", request_id, message)
        body = json.dumps({"error": {"type": kind, "message": message, "request_id": request_id}}, separators=(",", ":"))
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"x-request-id", request_id.encode()), (b"connection", b"close")]
        answer = (h11.Response(status_code=status, headers=headers, reason=STATUS_PHRASES[status]),
                  h11.Data(data=body.encode()), h11.EndOfMessage())
        for event in answer:
            self.transport.write(self.conn.send(event))
        self._refused = True
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the answer, then FIN: the client reads it once it stops sending
        self.loop.call_later(self.linger_s, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the answer is sent: what the client still sends is dropped until it closes or linger_s passes
        super().data_received(data)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        self._waiting_for = self.cycle  # a new cycle object means the next request's headers arrived
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is self._waiting_for and not self.transport.is_closing():
            self.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self._header_timer is not None and self.cycle is not self._waiting_for:
            self._header_timer.cancel()
            self._header_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._header_timer is None:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()
        super().connection_lost(exc)


HTTP_PROTOCOL = f"{__name__}:HeaderTimeoutH11Protocol"
"""The import path uvicorn's worker processes load the protocol from (with KEYRANK_HEADER_READ_TIMEOUT_S set)."""


def protocol_with_timeout(seconds: float) -> type[HeaderTimeoutH11Protocol]:
    """The protocol class with ``seconds`` as its header timeout (uvicorn takes a class, not an instance)."""
    return type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,), {"header_timeout_s": seconds})
