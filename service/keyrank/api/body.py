"""Reading a rerank body: strict JSON, parsed once, every refusal naming what and where.

Python's ``json`` takes what JSON does not (NaN, Infinity, 1e999 as inf, lone surrogates
from ``\\ud800`` escapes, duplicate keys: the last wins) and fails without a position on
what it cannot take (invalid UTF-8, nesting past the recursion limit, integers of more than
4300 digits). Each of those reached a handler as "There was an error parsing the body" or
as a 500 when an echoed document could not be written back. Here every one is a 400
``invalid_json`` with line and column, or, for a lone surrogate, a 422 naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from keyrank.errors import ClientClosed, InvalidRequest

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a body may have: a rerank body needs 3; Python's parser,
pydantic and the echo of a document recurse, and each would fail past its own limit."""
MAX_INT_DIGITS = 4300
"""Python's limit on int() of a string (sys.int_info.default_max_str_digits)."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?')  # an unterminated one runs to the end: linear, never retried
_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins escaped pairs, so any left is lone


class InvalidJson(Exception):
    """The body is not JSON as RFC 8259 has it; ``str`` says why and where."""

    def __init__(self, reason: str, text: str = "", position: int | None = None):
        where = ""
        if position is not None:
            line = text.count("\n", 0, position) + 1
            where = f" at line {line}, column {position - (text.rfind(chr(10), 0, position) + 1) + 1}"
        super().__init__(f"{reason}{where}")


class _Refused(Exception):
    """Raised from the parser's hooks: a literal JSON forbids or we cannot hold."""

    def __init__(self, reason: str, literal: str = ""):
        self.reason, self.literal = reason, literal


def _constant(literal: str) -> Any:
    raise _Refused(f"{literal} is not a JSON value", literal)


def _float(literal: str) -> float:
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise _Refused(f"number {literal[:20]} is out of range for a 64-bit float", literal)
    return value


def _int(literal: str) -> int:
    if len(literal) > MAX_INT_DIGITS:
        raise _Refused(f"integer of {len(literal)} digits (at most {MAX_INT_DIGITS})", literal)
    return int(literal)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) < len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise _Refused(f"duplicate key {json.dumps(duplicate)} in an object")
    return value


def parse_json(body: bytes) -> Any:
    """``body`` as a JSON value, or InvalidJson (400) / InvalidRequest (422, a lone surrogate) naming the place."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        shown = body[:e.start].decode("utf-8", errors="replace")
        raise InvalidJson(f"not UTF-8 (byte 0x{body[e.start]:02x})", shown, len(shown)) from None
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int, object_pairs_hook=_object)
    except json.JSONDecodeError as e:
        raise InvalidJson(e.msg, text, e.pos) from None
    except _Refused as e:
        raise InvalidJson(e.reason, text, _position(text, e.literal)) from None
    except RecursionError:  # nested past the parser's own limit (~1000 levels): deeper than ours for certain
        value = _TOO_DEEP
    # The parser's recursion is bounded (RecursionError, above), so the depth is checked on what it built: a rerank
    # body has a handful of containers. Only a body found too deep pays for the bracket walk that places the error.
    if value is _TOO_DEEP or (body.count(b"[") + body.count(b"{") > MAX_DEPTH and _nested_deeper(value)):
        at = _too_deep(body)
        raise InvalidJson(f"nested deeper than {MAX_DEPTH} arrays or objects", text, None if at is None else len(body[:at].decode()))
    if "\\u" in text and re.search(r"\\u[dD][89a-fA-F]", text):
        _refuse_lone_surrogates(value, "")
    return value


_TOO_DEEP = object()
"""What ``json.loads`` gave when it ran out of recursion."""


def _nested_deeper(value: Any) -> bool:
    """Whether containers nest more than MAX_DEPTH deep in a parsed value (walked with a stack, not recursion)."""
    if not isinstance(value, (list, dict)):
        return False
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))
    return False


def _too_deep(body: bytes) -> int | None:
    """Offset of the bracket that opens level MAX_DEPTH + 1 (outside strings), or None.

    Only the brackets are walked: each is dropped when a string holds it (its offset inside a string's span), and
    the depth is the running sum over the rest. Text with brackets in it (transcripts' ``{vocalsound}``) costs a
    pass of the string pattern and a few array operations, not a depth for every byte of the body."""
    if body.count(b"[") + body.count(b"{") <= MAX_DEPTH:
        return None
    codes = np.frombuffer(body, dtype=np.uint8)
    at = np.flatnonzero((codes == 0x5B) | (codes == 0x5D) | (codes == 0x7B) | (codes == 0x7D))  # [ ] { }
    spans = np.fromiter((i for m in _STRING.finditer(body) for i in m.span()), dtype=np.int64).reshape(-1, 2)
    inside = np.zeros(at.shape[0], dtype=bool)
    if spans.size:
        last = np.searchsorted(spans[:, 0], at, side="right") - 1  # the string starting at or before each bracket
        inside = (last >= 0) & (at < spans[np.maximum(last, 0), 1])
    at = at[~inside]
    opens = (codes[at] == 0x5B) | (codes[at] == 0x7B)
    over = np.flatnonzero(np.cumsum(np.where(opens, 1, -1)) > MAX_DEPTH)
    return int(at[over[0]]) if over.size else None


def _position(text: str, literal: str) -> int | None:
    """Offset of ``literal`` outside strings (the hooks get the literal, not where it was).

    The text before it parsed, so every string there is closed and the scan stays linear."""
    if not literal:
        return None
    pattern = r'"[^"\\]*(?:\\.[^"\\]*)*"|' + re.escape(literal) + r"(?![\w.])"
    found = next((m for m in re.finditer(pattern, text) if not m.group().startswith('"')), None)
    return found.start() if found else None


def _refuse_lone_surrogates(value: Any, path: str) -> None:
    """422 naming the first field whose value (or a key in it) holds a lone surrogate."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        if found:
            where = path or "body"
            raise InvalidRequest(
                f"{where}: lone surrogate U+{ord(found.group()):04X} at character {found.start()} is not text "
                "(a \\uD800-\\uDFFF escape must be one half of a pair)",
                field=where,
            )
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_lone_surrogates(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            found = _SURROGATE.search(key)
            if found:
                where = path or "body"
                raise InvalidRequest(
                    f"{where}: a field name holds lone surrogate U+{ord(found.group()):04X} at character "
                    f"{found.start()} (a \\uD800-\\uDFFF escape must be one half of a pair)",
                    field=where,
                )
            _refuse_lone_surrogates(item, f"{path}.{key}" if path else key)


def _is_json(request: Request) -> bool:
    """As FastAPI decides to parse: application/json or application/*+json."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media.startswith("application/") and (media == "application/json" or media.endswith("+json"))


class ParsedRequest(Request):
    """A request whose JSON body was parsed by ``parse_json`` before FastAPI asks for it."""

    parsed: Any = None

    async def json(self) -> Any:
        return self.parsed


class StrictJsonRoute(APIRoute):
    """The rerank routes' route class: the body is parsed by ``parse_json`` (once), before validation."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        validate_and_call = super().get_route_handler()

        async def handler(request: Request) -> Response:
            request = ParsedRequest(request.scope, request.receive)
            if _is_json(request):
                try:
                    body = await request.body()
                except ClientDisconnect:
                    raise ClientClosed("client closed the request while sending it") from None
                if body:
                    request.parsed = parse_json(body)
            return await validate_and_call(request)

        return handler
