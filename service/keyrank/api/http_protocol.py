"""uvicorn's h11 protocol with a header read timeout.

uvicorn closes idle keep-alive connections but waits forever for the headers of
a request that has begun: a client that sends half a request line holds a
connection (and a file descriptor) open indefinitely, which is how slow-loris
clients exhaust a server. Here a request's headers must be complete within
``header_timeout_s`` of the connection opening or of the previous response;
otherwise the connection is closed (the body has its own timeout, api/middleware).
"""

from __future__ import annotations

import asyncio
import os

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderTimeoutH11Protocol(H11Protocol):
    """``H11Protocol`` that closes a connection whose request headers do not arrive in time."""

    header_timeout_s: float = float(os.environ.get("KEYRANK_HEADER_READ_TIMEOUT_S", "10"))
    """Seconds a request's line and headers may take (class attribute: uvicorn builds the protocol). Read from
    the environment when the module loads, so ``keyrank serve --workers N`` can name this class by its
    import path (``HTTP_PROTOCOL``) for worker processes, which cannot be handed a class made at run time."""

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
