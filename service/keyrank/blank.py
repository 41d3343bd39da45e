"""What counts as text with nothing to read, for queries and documents alike.

A character prints nothing by itself when it is a control, a format character
(zero-width, U+2060, soft hyphen, bidi marks), a surrogate, a combining mark
without a base, a space or separator, or one of the blank letters below. A
document of nothing else is blank (it ranks last, unscored); a query of nothing
else is refused, since the model would read no query at all.

The query rule is also the wire schema's ``pattern`` (``READABLE``), so a client
that validates against the OpenAPI document refuses what the gateway refuses.
A JSON Schema pattern is an ECMA-262 regex read without the ``u`` flag, which
sees characters past U+FFFF as two surrogates: the pattern therefore names the
invisible characters of the Basic Multilingual Plane only and counts any
character beyond it as readable, and the gateway applies the same pattern.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Mn", "Me", "Zs", "Zl", "Zp"})
"""Unicode categories that print nothing by themselves: controls, format (zero-width, U+2060, soft
hyphen, bidi marks), surrogates, combining marks without a base, spaces and separators."""
BLANK_LETTERS = "\u115f\u1160\u3164\uffa0\u2800"
"""Hangul fillers (letters that Unicode marks default-ignorable) and the blank Braille cell."""


def _invisible_ranges(last: int, *, surrogates: bool) -> list[tuple[int, int]]:
    """Runs of invisible code points up to ``last``, merged into ranges."""
    invisible = {c for c in range(last + 1) if unicodedata.category(chr(c)) in INVISIBLE_CATEGORIES}
    invisible |= {ord(c) for c in BLANK_LETTERS}
    if not surrogates:
        invisible -= set(range(0xD800, 0xE000))
    ranges: list[list[int]] = []
    for c in sorted(invisible):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return [(a, b) for a, b in ranges]


READABLE = "[^" + "".join(f"\\u{a:04x}-\\u{b:04x}" if b > a else f"\\u{a:04x}"
                          for a, b in _invisible_ranges(0xFFFF, surrogates=False)) + "]"
"""A readable character, as a regex that Python's ``re`` and ECMA-262 read alike (``\\uXXXX`` escapes only):
the query's schema pattern. Characters beyond U+FFFF all count as readable."""
_READABLE_QUERY = re.compile(READABLE)


def is_readable_query(query: str) -> bool:
    """The query has a character the model can read (the schema's ``READABLE`` pattern)."""
    return _READABLE_QUERY.search(query) is not None


def is_blank(text: str) -> bool:
    """True when a document has nothing to read: no character that prints by itself, in all of Unicode."""
    return _readable_character().search(text) is None


def warm_up() -> None:
    """Build what ``is_blank`` reads (~0.4 s) now, at start, so that no request waits for it."""
    _readable_character()


@functools.cache
def _readable_character() -> re.Pattern[str]:
    """Any character not invisible, in all of Unicode (built once: ~0.2 s over all code points)."""
    members = "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in _invisible_ranges(sys.maxunicode, surrogates=True))
    return re.compile(f"[^{members}]")
