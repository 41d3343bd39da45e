"""What the wire types share: base classes (strict requests), integer and query fields, examples."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from keyrank.blank import READABLE, is_readable_query
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

EXAMPLE_QUERY = "what is the capital of the united states"
EXAMPLE_DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
]


class Wire(BaseModel):
    """Response models: field docstrings document the OpenAPI schema."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class StrictRequest(Wire):
    """keyrank's requests: types are not coerced and an unknown field is an error, not silently dropped."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid", strict=True)


class VendorRequest(Wire):
    """Other servers' requests (Jina, Cohere, TEI, Infinity): types are not coerced; unknown fields are accepted
    and reported as ignored (api/routes/vendor.py's ``ignored_fields``)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="allow", strict=True)
    ignored_when_sent: ClassVar[frozenset[str]] = frozenset({"return_embeddings", "priority"})
    """The dialect's fields accepted for compatibility that change nothing here."""
    unnamed_models: ClassVar[frozenset[str]] = frozenset()
    """``model`` values that name no model (a client's placeholder): never reported as another model."""


NON_BLANK = READABLE
"""JSON Schema pattern of a query: at least one readable character of the Basic Multilingual Plane (keyrank/blank.py),
checked with a readable message by ``non_blank``, which applies this very pattern (a schemathesis query that matched
the pattern once got a 422 from a different test), and then the whole rule, for what lies beyond U+FFFF."""


def non_blank(query: str) -> str:
    """The query, unless it has nothing to read (whitespace, controls, format, zero-width, tag, private-use or combining
    characters alone): the schema's pattern, then keyrank/blank.py's whole rule for what the pattern cannot name."""
    if not is_readable_query(query):
        raise ValueError("query must contain a non-whitespace, readable character (not only control, format, zero-width, "
                         "tag, private-use or combining characters)")
    return query


def _whole_number(value: Any) -> Any:
    """JSON Schema counts 3.0 as an integer: take it as 3 (and nothing else that is not an int)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Integer = Annotated[int, BeforeValidator(_whole_number)]
"""A JSON integer, or a number with no fraction (3.0); never "3" or true."""
Count = Annotated[int, Field(ge=1), BeforeValidator(_whole_number)]  # this order keeps `minimum` in the schema
"""An ``Integer`` of at least 1."""


def query_field(**extra: Any) -> Any:
    return Field(min_length=1, examples=[EXAMPLE_QUERY], json_schema_extra={"pattern": NON_BLANK}, **extra)


class EvidenceSpan(Wire):
    """A span of the caller's document that the score rests on."""

    start: int
    """Character offset of the span's start in the document text (for object documents: the text read)."""
    end: int
    """Character offset one past the span's end."""


class Coverage(Wire):
    """keyrank's extension fields of a vendor result, present only when the request sent
    ``return_evidence: true`` (clients that do not know them ignore them)."""

    evidence: list[EvidenceSpan] | None = None
    """Spans read for the score (keyb2: selected blocks; maxp: best window); with return_evidence."""
    truncated: bool | None = None
    """True whenever the model did not read the whole document (read_tokens < document_tokens); with return_evidence."""
    read_tokens: int | None = None
    """Tokens of the document the score rests on (keyb2: the selected blocks; windowed strategies: the windows
    scored; firstp: the prefix); with return_evidence."""
    document_tokens: int | None = None
    """Tokens the whole document has; with return_evidence."""
