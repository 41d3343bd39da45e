"""What counts as text with nothing to read, for queries and documents alike: one rule, ``is_blank``.

A character is unreadable when it prints nothing by itself: a control, a format character (zero-width,
U+2060, soft hyphen, bidi marks, the tag characters U+E0000-U+E007F), a surrogate, a combining mark without
a base, a space or separator, or one of the blank letters below; or when it stands for no text the model
could read: a private-use character (U+E000-U+F8FF and planes 15-16: no meaning outside an agreement with
the sender, no glyph without its font), a noncharacter (U+FDD0-U+FDEF and the last two code points of every
plane, which Unicode guarantees are never text) or U+FFFD, the mark a decoder leaves for bytes it could
not read. Text with no readable character is blank: a blank document ranks last, unscored (on every route
and in ``Reranker``); a blank query is refused, since the model would read no query at all.

Why this rule and not the tokenizer's own verdict: it is the same for every model served and for the
schema a client validates against, and it contains the tokenizer's. BERT's normalizer deletes controls,
format and private-use characters and U+FFFD, and its accent stripping drops combining marks: every
character from which the model's tokenizer reads no token at all is unreadable here (but for a spacing
mark or two that the tokenizer's older Unicode tables call combining; ``tests/test_blank.py`` checks the
Basic Multilingual Plane and the planes of tags and private use against the tokenizer). The rule goes further
where the tokenizer reads only ``[UNK]`` from a character that prints nothing (an enclosing mark, a
Hangul filler, a noncharacter): a score of ``[UNK]`` alone ranks nothing. Unassigned code points stay
readable: one assigned by a later Unicode version than this Python's must not turn a document blank.

The query rule is also the wire schema's ``pattern`` (``READABLE``), so a client that validates against
the OpenAPI document refuses what the gateway refuses. A JSON Schema pattern is an ECMA-262 regex read
without the ``u`` flag, which sees a character past U+FFFF as two surrogates: the pattern therefore names
the unreadable characters of the Basic Multilingual Plane only and counts any character beyond it as
readable. The gateway applies that pattern and then the whole rule (``is_readable_query``): a query made
only of unreadable characters beyond U+FFFF (tag characters, supplementary private use, the variation
selectors supplement) passes the schema's pattern and is refused by the gateway with the same 422 naming
``query``; that is the one place where the two can differ.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Mn", "Me", "Zs", "Zl", "Zp"})
"""Unicode categories with nothing to read: controls, format (zero-width, U+2060, soft hyphen, bidi marks, tag
characters), surrogates, private use, combining marks without a base, spaces and separators."""
BLANK_LETTERS = "\u115f\u1160\u3164\uffa0\u2800"
"""Hangul fillers (letters that Unicode marks default-ignorable) and the blank Braille cell."""
NOT_TEXT = "\ufffd"
"""U+FFFD REPLACEMENT CHARACTER: what a decoder leaves for bytes it could not read (BERT's normalizer deletes it).
The noncharacters are named by ``_noncharacters``."""
BLANK_DOCUMENT_SCORE = -10_000.0
"""relevance_score of a blank document: below any cross-encoder logit or sum of them, so it ranks after every
document with text (0.0 after the vendor routes' sigmoid)."""


def _noncharacters(last: int) -> set[int]:
    """U+FDD0-U+FDEF and U+xFFFE, U+xFFFF of every plane up to ``last``: never text (Unicode's guarantee)."""
    plane_ends = {plane + end for plane in range(0, last + 1, 0x10000) for end in (0xFFFE, 0xFFFF)}
    return (set(range(0xFDD0, 0xFDF0)) | plane_ends) & set(range(last + 1))


def _invisible_ranges(last: int, *, surrogates: bool) -> list[tuple[int, int]]:
    """Runs of unreadable code points up to ``last``, merged into ranges."""
    invisible = {c for c in range(last + 1) if unicodedata.category(chr(c)) in INVISIBLE_CATEGORIES}
    invisible |= {ord(c) for c in BLANK_LETTERS + NOT_TEXT} | _noncharacters(last)
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
the query's schema pattern. Characters beyond U+FFFF all count as readable here (``is_readable_query``)."""
_READABLE_QUERY = re.compile(READABLE)


def is_readable_query(query: str) -> bool:
    """The query has a character the model can read: the schema's ``READABLE`` pattern finds one, and the whole
    rule (``is_blank``) agrees, which also reads the characters beyond U+FFFF that the pattern cannot name."""
    return _READABLE_QUERY.search(query) is not None and not is_blank(query)


def is_blank(text: str) -> bool:
    """True when text has nothing to read: no readable character, in all of Unicode (the module's rule)."""
    return _readable_character().search(text) is None


def warm_up() -> None:
    """Build what ``is_blank`` reads (~0.4 s) now, at start, so that no request waits for it."""
    _readable_character()


@functools.cache
def _readable_character() -> re.Pattern[str]:
    """Any readable character, in all of Unicode (built once: ~0.4 s over all code points)."""
    members = "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in _invisible_ranges(sys.maxunicode, surrogates=True))
    return re.compile(f"[^{members}]")
