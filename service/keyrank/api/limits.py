"""The configured request limits, checked after parsing and before any work (never in the wire types).

Counts are checked before validation (``BodyBounds``): a body's documents past KEYRANK_MAX_DOCUMENTS, its
unknown fields past ``MAX_UNKNOWN_FIELDS`` and its values past ``VALUES_PER_DOCUMENT`` per document allowed
are refused before pydantic builds one error per item (1,000,000 wrong items took 47 s and 2.5 GB), from the
parsed body (``check_parsed``) or, when the body holds too many values to be worth parsing, from its bytes
(``check_shape``, api/body.py's ``scan``). Whatever else can fail once per item (unknown keys of a document
object, items of ``rank_fields``) is cut to the first ``ERRORS_KEPT`` failing ones, the rest counted.

Each answer is a 422 that names the field and the setting; the same limits are
written into the OpenAPI schema as maxItems/maxLength (``openapi_limits``), so
a client generated from the schema cannot exceed them. The schema's strategy
enum likewise lists only the strategies this deployment can run (a trained
strategy needs its trained part under models/gateway/). Each dialect's record
(api/dialect.py) says which schema is its request and what it calls the documents.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel

from keyrank.config import Settings
from keyrank.errors import InvalidRequest, LimitExceeded
from keyrank.strategies import REGISTRY

if TYPE_CHECKING:
    from keyrank.api.dialect import Dialect

MAX_UNKNOWN_FIELDS = 64
"""Unknown top-level fields a request may carry: keyrank's own shape refuses each one; the vendor shapes
ignore them (a newer SDK may send a few more), up to this many; past it the request is refused."""
VALUES_PER_DOCUMENT = 64
"""JSON values a request may hold per document KEYRANK_MAX_DOCUMENTS allows, counting at least 1,000 documents
(64,000 by default: a thousand document objects with dozens of metadata fields fit; 64,000 values parse in
at most ~0.1 s)."""
ERRORS_KEPT = 32
"""Failing items of one kind (unknown keys of document objects, items of a list of strings) validated, the
rest counted: more than api/errors.py's MAX_DETAILS, so the answer lists what it would have listed."""
_DOCUMENTS_SETTING = "KEYRANK_MAX_DOCUMENTS"


@dataclass(frozen=True)
class BodyBounds:
    """What a request body of one wire type may hold before it is validated."""

    documents_field: str
    """The request's name for the documents (TEI: texts)."""
    max_documents: int
    """KEYRANK_MAX_DOCUMENTS."""
    max_values: int
    """``VALUES_PER_DOCUMENT`` per document allowed."""
    fields: frozenset[str]
    """The wire type's fields; any other is unknown."""
    unknown_refused: bool
    """Unknown fields are errors (keyrank's shape), else ignored (the vendors')."""
    item_fields: frozenset[str] | None
    """The fields of a document object when its unknown keys are errors (keyrank's ``DocumentIn``), else None."""
    string_lists: tuple[str, ...]
    """The other fields that are lists of strings (``rank_fields``)."""

    @property
    def tracked_members(self) -> int:
        """Top-level members whose keys a scan reads: enough to tell the unknown ones past the limit."""
        return len(self.fields) + MAX_UNKNOWN_FIELDS + 1

    @classmethod
    def of(cls, model: type[BaseModel], settings: Settings) -> BodyBounds:
        fields, unknown_refused, item_fields, documents_field, string_lists = _model_bounds(model)
        return cls(documents_field, settings.max_documents, VALUES_PER_DOCUMENT * max(settings.max_documents, 1_000),
                   fields, unknown_refused, item_fields, string_lists)


@functools.cache
def _model_bounds(model: type[BaseModel]) -> tuple[frozenset[str], bool, frozenset[str] | None, str, tuple[str, ...]]:
    """What ``BodyBounds`` reads of a wire type: its fields, whether unknown ones are errors, its documents
    field (``texts`` or ``documents``) and the strict object type of its documents, its lists of strings."""
    fields = frozenset(model.model_fields)
    documents_field = "texts" if "texts" in fields else "documents"
    item_fields = None
    string_lists = []
    for name, info in model.model_fields.items():
        members = _members(info.annotation)
        if name == documents_field:
            for member in members:
                item = typing.get_args(member)[0] if typing.get_origin(member) is list else None
                for kind in _members(item):
                    if isinstance(kind, type) and issubclass(kind, BaseModel) and kind.model_config.get("extra") == "forbid":
                        item_fields = frozenset(kind.model_fields)
        elif any(typing.get_origin(m) is list and typing.get_args(m) == (str,) for m in members):
            string_lists.append(name)
    return fields, model.model_config.get("extra") == "forbid", item_fields, documents_field, tuple(string_lists)


def _members(annotation: Any) -> tuple[Any, ...]:
    """The members of a union annotation (``str | None``), or the annotation alone."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


@dataclass
class BodyShape:
    """What ``api/body.py``'s ``scan`` measured of a body's bytes, without parsing it."""

    values: int
    """Commas and opening brackets outside strings: at least the values the body holds, minus one."""
    is_object: bool
    """The body starts with ``{``."""
    members: int
    """Members of the top-level object (0 when empty or not an object)."""
    keys: list[str | None]
    """The first members' keys, in order (None for one that is not a JSON string)."""
    member_values: list[int]
    """Values nested in each of the first members' value (``values`` counted inside it)."""
    member_items: list[int]
    """Items (or members) of each of the first members' value when it is a container (an empty one counts 1)."""
    too_deep_at: int | None = None
    """Offset of the bracket that opens level MAX_DEPTH + 1, if one does."""


def check_shape(shape: BodyShape, bounds: BodyBounds) -> None:
    """Refuse a body measured (api/body.py's ``scan``) to hold more values than ``bounds`` allow, naming what
    holds them: its unknown fields past the limit, its documents past KEYRANK_MAX_DOCUMENTS, else the member
    holding the most. A body within them returns (and is parsed)."""
    if shape.values <= bounds.max_values:
        return
    if not shape.is_object:
        raise InvalidRequest(f"body: a JSON object is required (this one holds {shape.values} values)", field="body")
    keys = [key if key is not None else "?" for key in shape.keys]
    unknown = [key for key in keys if key not in bounds.fields]
    # Members past the keys read are counted as unknown: at most len(bounds.fields) of them could be known.
    _check_unknown(unknown, len(unknown) + shape.members - len(keys), bounds)
    for key, items in zip(keys, shape.member_items):
        if key == bounds.documents_field and items > bounds.max_documents:
            raise as_sent(LimitExceeded("documents", f"{items} documents", bounds.max_documents, _DOCUMENTS_SETTING),
                          bounds.documents_field)
    held, key = max(zip(shape.member_values, keys), default=(shape.values, "body"))
    raise LimitExceeded(key, f"{held} JSON values", bounds.max_values, f"{VALUES_PER_DOCUMENT} per document of {_DOCUMENTS_SETTING}")


def check_parsed(value: Any, bounds: BodyBounds) -> int:
    """Refuse a parsed body's counts that validation would pay for item by item: unknown fields past the
    limit, documents past KEYRANK_MAX_DOCUMENTS. Cut what would fail once per item to its first
    ``ERRORS_KEPT`` failures (unknown keys of document objects, non-strings in a list of strings), which
    keeps the request invalid and its first errors as they were; returns how many failing items were cut."""
    if not isinstance(value, dict):
        return 0
    unknown = [key for key in value if key not in bounds.fields]
    _check_unknown(unknown, len(unknown), bounds)
    documents = value.get(bounds.documents_field)
    if isinstance(documents, list) and len(documents) > bounds.max_documents:
        raise as_sent(LimitExceeded("documents", f"{len(documents)} documents", bounds.max_documents, _DOCUMENTS_SETTING),
                      bounds.documents_field)
    cut = 0
    if bounds.item_fields is not None and isinstance(documents, list):
        kept = 0
        for i, document in enumerate(documents):
            if not isinstance(document, dict):
                continue
            extra = [key for key in document if key not in bounds.item_fields]
            if kept + len(extra) > ERRORS_KEPT:
                dropped = set(extra[max(ERRORS_KEPT - kept, 0):])
                documents[i] = {key: item for key, item in document.items() if key not in dropped}
                cut += len(dropped)
            kept = min(kept + len(extra), ERRORS_KEPT)
    for name in bounds.string_lists:
        items = value.get(name)
        if isinstance(items, list):
            failing = [i for i, item in enumerate(items) if not isinstance(item, str)]
            if len(failing) > ERRORS_KEPT:
                value[name] = items[: failing[ERRORS_KEPT]]
                cut += len(failing) - ERRORS_KEPT
    return cut


def _check_unknown(unknown: list[str], total: int, bounds: BodyBounds) -> None:
    """Refuse ``total`` unknown fields (``unknown``: the first ones, in order) past ``MAX_UNKNOWN_FIELDS``:
    on keyrank's shape as validation names them (``extra_forbidden``, the first ``ERRORS_KEPT``, the rest
    counted), on the vendors' in one message naming the first few."""
    if total <= MAX_UNKNOWN_FIELDS:
        return
    if bounds.unknown_refused:
        errors = [{"type": "extra_forbidden", "loc": ("body", key), "msg": "Extra inputs are not permitted", "input": None}
                  for key in unknown[:ERRORS_KEPT]]
        refused = RequestValidationError(errors)
        refused.errors_not_built = total - len(errors)  # type: ignore[attr-defined]
        raise refused
    named = ", ".join(_cut(key) for key in unknown[:3])
    raise InvalidRequest(f"body: {total} unknown fields, more than the {MAX_UNKNOWN_FIELDS} a request may carry "
                         f"(they would be ignored): {named}, ...", field=_cut(unknown[0]))


def _cut(name: str, most: int = 64) -> str:
    return name if len(name) <= most else name[: most - 3] + "..."


def check_limits(query: str, texts: Sequence[str], settings: Settings) -> None:
    """Raise LimitExceeded, naming the setting, when a configured limit is exceeded."""
    if len(texts) > settings.max_documents:
        raise LimitExceeded("documents", f"{len(texts)} documents", settings.max_documents, "KEYRANK_MAX_DOCUMENTS")
    if len(query) > settings.max_query_chars:
        raise LimitExceeded("query", f"{len(query)} characters", settings.max_query_chars, "KEYRANK_MAX_QUERY_CHARS")
    for i, text in enumerate(texts):
        if len(text) > settings.max_document_chars:
            raise LimitExceeded(
                f"documents[{i}]", f"{len(text)} characters", settings.max_document_chars, "KEYRANK_MAX_DOCUMENT_CHARS"
            )


def as_sent(exc: InvalidRequest, documents_field: str) -> InvalidRequest:
    """The same error, its field ``documents...`` named as the dialect's request names the documents (TEI:
    ``texts...``): the limits and admission speak of ``documents``."""
    field = exc.field or ""
    if field.startswith("documents"):
        exc.field = documents_field + field[len("documents"):]
        exc.args = (str(exc).replace(field, exc.field, 1), *exc.args[1:])
    return exc


def openapi_limits(schema: dict[str, Any], settings: Settings, dialects: Sequence[Dialect]) -> dict[str, Any]:
    """Write the limits into each dialect's request schema: documents maxItems, query and text maxLength."""
    components = schema.get("components", {}).get("schemas", {})
    for dialect in dialects:
        if dialect.request is None:
            continue
        properties = components.get(dialect.request.__name__, {}).get("properties", {})
        if "query" in properties:
            properties["query"]["maxLength"] = settings.max_query_chars
        if dialect.documents_field in properties:
            documents = properties[dialect.documents_field]
            documents["maxItems"] = settings.max_documents
            items = documents.get("items", {})
            for member in items.get("anyOf", [items]):
                if member.get("type") == "string":
                    member["maxLength"] = settings.max_document_chars
                elif "text" in member.get("properties", {}):  # the vendors' object documents
                    member["properties"]["text"]["maxLength"] = settings.max_document_chars
    text = components.get("DocumentIn", {}).get("properties", {}).get("text")
    if text is not None:
        text["maxLength"] = settings.max_document_chars
    strategy = components.get("RerankRequest", {}).get("properties", {}).get("strategy", {})
    for member in strategy.get("anyOf", []):
        if "enum" in member:
            member["enum"] = [name for name in member["enum"] if name in servable_strategies(settings)]
    return schema


def servable_strategies(settings: Settings) -> list[str]:
    """The registry's strategies whose trained parts (if any) are in the prepared model folder."""
    return [spec.name for spec in REGISTRY.values() if not spec.missing_parts(settings.gateway_dir)]
