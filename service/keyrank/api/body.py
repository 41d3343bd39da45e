"""Reading a rerank body: strict JSON, parsed once, every refusal naming what and where.

Python's ``json`` takes what JSON does not (NaN, Infinity, 1e999 as inf, lone surrogates
from ``\\ud800`` escapes, duplicate keys: the last wins) and fails without a position on
what it cannot take (invalid UTF-8, nesting past the recursion limit, integers of more than
4300 digits). Each of those reached a handler as "There was an error parsing the body" or
as a 500 when an echoed document could not be written back. Here every one is a 400
``invalid_json`` with line and column, or, for a lone surrogate, a 422 naming the field.

What a body costs is bounded before it is parsed (``read_json``): a body under the size limit
can hold millions of values (``[1,1,...]``: 8 M in 16 MB), and parsing them took seconds and
hundreds of MB, validating them (one error each) tens of seconds and gigabytes. A body whose
bytes hold more separators and brackets than a request may have values (``BodyBounds``,
api/limits.py) is measured by ``scan``, a vectorised pass over its bytes that never builds a
value, and refused naming the field that holds them; the rest is parsed off the event loop
when it is large (``THREAD_BYTES``), and checked for counts (documents, unknown fields) before
validation builds a single error (api/limits.py's ``check_parsed``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from keyrank.api.limits import BodyBounds, BodyShape, check_parsed, check_shape
from keyrank.errors import ClientClosed, InvalidRequest, LimitExceeded
from keyrank.strategies import STRATEGIES

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a body may have: a rerank body needs 3; Python's parser,
pydantic and the echo of a document recurse, and each would fail past its own limit."""
MAX_INT_DIGITS = 4300
"""Python's limit on int() of a string (sys.int_info.default_max_str_digits)."""
THREAD_BYTES = 64 * 1024
"""A body at least this large is measured and parsed on a worker thread, not on the event loop: parsing 64 KB
costs about a millisecond, 16 MB of values up to ~0.1 s once ``scan`` bounded them."""
SCAN_CHUNK = 256 * 1024
"""Bytes ``scan`` reads at a time: its arrays stay a few MB whatever the body's size."""

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


_KINDS = bytes(dict(zip(b"[{]},:\"", (1, 1, 2, 2, 3, 4, 5))).get(byte, 0) for byte in range(256))
"""``bytes.translate`` table of the bytes ``scan`` reads: 1 opens a container, 2 closes one, 3 is a comma, 4 a
colon, 5 a quote; every other byte becomes 0."""


def scan(body: bytes, first: int) -> BodyShape:
    """Measure ``body`` without building any value: its values, its top-level members and, for the first
    ``first`` members, their keys and how much each holds. Linear in the body, in chunks (``_chunks``,
    ``_outside_strings``; a 16 MB body of a million values: ~0.2 s, a few MB of arrays, numpy releasing the
    GIL). A body that is not JSON is measured all the same; what it holds past the counts is the parser's to refuse."""
    in_string = depth = members = values = 0
    member_values = np.zeros(first, dtype=np.int64)
    member_commas = np.zeros(first, dtype=np.int64)
    member_opens = np.zeros(first, dtype=np.int64)
    starts: list[int] = []  # offsets of the top-level "{" and commas: a key follows each
    colons: list[int] = []
    too_deep_at = None
    for start_of_chunk, raw in _chunks(body):
        if in_string and b'"' not in raw:
            continue  # inside one string throughout
        if b"\\" in raw:
            raw = raw.replace(b"\\\\", b"__").replace(b'\\"', b"__")
        kinds = np.frombuffer(raw.translate(_KINDS), dtype=np.uint8)
        at = np.flatnonzero(kinds)
        at, k, in_string = _outside_strings(at, kinds[at], in_string)
        if not at.size:
            continue
        opens, commas = k == 1, k == 3
        step = opens.view(np.int8) - (k == 2).view(np.int8)
        level = np.cumsum(step, dtype=np.int32)
        level += depth
        depth = int(level[-1])
        if too_deep_at is None and level.max() > MAX_DEPTH:
            too_deep_at = int(at[np.argmax(level > MAX_DEPTH)]) + start_of_chunk
        counted = opens | commas
        values += int(np.count_nonzero(counted))
        top = level == 1  # the top-level object's own commas and colons (and its "{")
        separators = commas & top
        if not separators.any():  # the whole chunk is inside one member (or before the first)
            if members < first:
                second = level == 2
                member_values[members] += np.count_nonzero(counted & (level >= 2))
                member_commas[members] += np.count_nonzero(commas & second)
                member_opens[members] += np.count_nonzero(opens & second)
        elif members >= first:  # past the members tracked: only their number
            members += int(np.count_nonzero(separators))
        else:
            member = np.cumsum(separators, dtype=np.int64)
            member += members
            members = int(member[-1])
            tracked = member < first
            for totals, which in ((member_values, counted & (level >= 2)), (member_commas, commas & (level == 2)),
                                  (member_opens, opens & (level == 2))):
                totals += np.bincount(member[which & tracked], minlength=first)[:first]
        if len(starts) < first:
            starts.extend((at[separators | (opens & top)] + start_of_chunk)[: first].tolist())
        if len(colons) < first:
            colons.extend((at[(k == 4) & top] + start_of_chunk)[: first].tolist())
    is_object = body.lstrip()[:1] == b"{"
    count = members + 1 if is_object and colons else 0
    keys = [_key(body, a, b) for a, b in zip(starts[:count], colons[:count])][:first]
    items = [int(c) + 1 if o else 0 for c, o in zip(member_commas, member_opens)]
    return BodyShape(values, is_object, count, keys, member_values[: len(keys)].tolist(), items[: len(keys)], too_deep_at)


def _chunks(body: bytes):
    """(offset, bytes) of ``body`` in pieces of about ``SCAN_CHUNK``; a run of backslashes is never split."""
    start, size = 0, len(body)
    while start < size:
        end = min(start + SCAN_CHUNK, size)
        while end < size and body[end - 1] == 0x5C:
            end += 1
        yield start, body[start:end]
        start = end


def _outside_strings(at: np.ndarray, k: np.ndarray, in_string: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The structural bytes (offsets ``at``, kinds ``k``) outside strings, and whether the chunk ends inside one.

    Escapes were blanked (``\\\\`` and ``\\"``, left to right, as a JSON parser pairs them), so the quotes left
    open and close strings: the bytes between an odd and the next even quote are inside one."""
    quotes = k == 5
    if not (in_string or quotes.any()):
        return at, k, in_string
    inside = np.cumsum(quotes, dtype=np.uint8)  # wraps at 256: its parity is what counts
    inside &= 1
    if in_string:
        inside ^= 1
    if inside.size:
        in_string = int(inside[-1])
    outside = ~(inside.view(bool) | quotes)
    return at[outside], k[outside], in_string


def _key(body: bytes, after: int, colon: int) -> str | None:
    """The member key between a top-level ``{`` or comma and its colon, or None."""
    try:
        key = json.loads(body[after + 1 : colon])
    except ValueError:
        return None
    return key if isinstance(key, str) else None


def read_json(body: bytes, bounds: BodyBounds | None) -> Any:
    """``body`` parsed (``parse_json``) once its size in values is known to be within ``bounds``.

    Raises InvalidJson, or InvalidRequest / LimitExceeded / RequestValidationError naming what is too many."""
    if bounds is None:
        return parse_json(body)
    # Each counted value takes a byte of its own (a comma or a bracket): a body shorter than the bound, or
    # with fewer of those bytes anywhere, holds few enough values. Only the rest is scanned.
    if len(body) > bounds.max_values and body.count(b",") + body.count(b"[") + body.count(b"{") > bounds.max_values:
        shape = scan(body, bounds.tracked_members)
        if shape.values > bounds.max_values and shape.too_deep_at is not None:  # as parse_json would say
            shown = body[: shape.too_deep_at].decode("utf-8", errors="replace")
            raise InvalidJson(f"nested deeper than {MAX_DEPTH} arrays or objects", shown, len(shown))
        check_shape(shape, bounds)
    return parse_json(body)


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
    """The rerank routes' route class: the body is read by ``read_json`` (once), before validation: parsed
    on a worker thread when large, refused early when it holds more than a request may."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        validate_and_call = super().get_route_handler()
        annotation = self.body_field.field_info.annotation if self.body_field is not None else None
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None

        async def handler(request: Request) -> Response:
            request = ParsedRequest(request.scope, request.receive)
            not_built = 0
            if _is_json(request):
                try:
                    body = await request.body()
                except ClientDisconnect:
                    raise ClientClosed("client closed the request while sending it") from None
                if body:
                    settings = request.app.state.settings
                    bounds = None if model is None else BodyBounds.of(model, settings)
                    if len(body) >= THREAD_BYTES:
                        request.parsed = await asyncio.to_thread(read_json, body, bounds)
                    else:
                        request.parsed = read_json(body, bounds)
                    if bounds is not None:
                        try:
                            not_built = check_parsed(request.parsed, bounds)
                        except LimitExceeded:  # counted with the strategy asked for, as api/ranking.py counts its limits
                            asked = request.parsed.get("strategy") if "strategy" in bounds.fields else None
                            asked = asked or settings.default_strategy
                            request.state.strategy = asked if isinstance(asked, str) and asked in STRATEGIES else "-"
                            raise
            try:
                return await validate_and_call(request)
            except RequestValidationError as exc:
                exc.errors_not_built = not_built  # type: ignore[attr-defined]  # api/errors.py counts them
                raise

        return handler
