"""ASGI middleware, outermost first: request id, closing after an unread body, API key, body limit.

Each works on the raw ASGI messages, before FastAPI reads or parses the body:
an unauthenticated or oversized request costs the gateway a header scan, never
a JSON parse, and the connection it came on (``CloseUnreadBody``).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import uuid
from collections.abc import Collection

from fastapi import HTTPException, Request
from pydantic import SecretStr
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keyrank.api.errors import error_response, record

_REQUEST_ID = re.compile(r"^[\w.:@/+=-]{1,128}$")  # echo only ids that are safe to log and to put in a header


class RequestId:
    """Gives every request an id (the caller's ``X-Request-ID`` if sane) and echoes it."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = Headers(scope=scope).get("x-request-id", "")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)


class CloseUnreadBody:
    """``Connection: close`` on an answer sent before the request's body was read (401, 413, 415, 404, ...).

    Kept alive, the server would read and discard the rest of the body before the next request: a client
    refused with 401 that kept streaming a chunked body held the connection, and 13.6 GB of reading, until
    the header timeout. Closed, it costs that client a new connection and the gateway nothing more.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        unread = "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0")
        if not unread:
            return await self.app(scope, receive, send)

        async def reading() -> Message:
            nonlocal unread
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                unread = False  # the whole body is in, or the client is gone
            return message

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start" and unread:
                MutableHeaders(scope=message)["Connection"] = "close"
            await send(message)

        await self.app(scope, reading, closing)


class ApiKeyGate:
    """401 unless ``Authorization: Bearer <KEYRANK_API_KEY>``, on the rerank routes (``paths``), before the body is read.

    The probes, /metrics and the docs stay open: kubelets and Prometheus call them from inside the
    cluster and they carry no request content.
    """

    def __init__(self, app: ASGIApp, api_key: SecretStr | None, paths: Collection[str]):
        self.app = app
        self.key = api_key.get_secret_value().encode() if api_key is not None else None
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is None or scope["type"] != "http" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), self.key):
            return await self.app(scope, receive, send)
        request = Request(scope)
        record(request, "invalid")
        if not token:
            message, challenge = "missing API key: send Authorization: Bearer <key>", "Bearer"
        else:
            message, challenge = "invalid API key", 'Bearer error="invalid_token"'
        response = error_response(request, 401, "unauthorized", message, headers={"WWW-Authenticate": challenge})
        await response(scope, receive, send)


class BodyLimit:
    """415 for compressed bodies, 413 for bodies over ``max_body_bytes``, 408 for bodies not in within ``read_timeout_s``: before
    FastAPI parses (or even buffers) them, so neither a huge nor a trickling body holds the gateway."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, read_timeout_s: float):
        self.app = app
        self.limit = max_body_bytes
        self.read_timeout_s = read_timeout_s

    def _too_large(self, size: str) -> str:
        return f"request body of {size} bytes exceeds the limit of {self.limit} (KEYRANK_MAX_BODY_BYTES)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            # Decompressing would make the size limit a limit on the compressed size (a zip bomb's).
            request = Request(scope)
            record(request, "invalid")
            message = f"Content-Encoding {encoding[:40]!r} is not accepted: send the body uncompressed"
            response = error_response(request, 415, "unsupported_encoding", message, field="body")
            return await response(scope, receive, send)
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            request = Request(scope)
            record(request, "invalid")
            response = error_response(request, 413, "body_too_large", self._too_large(declared))
            return await response(scope, receive, send)
        received = 0
        body_done = False
        deadline = asyncio.get_running_loop().time() + self.read_timeout_s

        async def guarded_receive() -> Message:
            nonlocal received, body_done
            if body_done:  # after the body only http.disconnect comes, whenever the client leaves
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                # Raised inside FastAPI's body read, which re-raises HTTPException to our handler.
                raise HTTPException(
                    408, f"request body not received within {self.read_timeout_s:g} s (KEYRANK_BODY_READ_TIMEOUT_S)"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.limit:
                    raise HTTPException(413, self._too_large(f"more than {self.limit}"))
            return message

        await self.app(scope, guarded_receive, send)
