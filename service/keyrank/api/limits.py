"""The configured request limits, checked after parsing and before any work (never in the wire types).

Each answer is a 422 that names the field and the setting; the same limits are
written into the OpenAPI schema as maxItems/maxLength (``openapi_limits``), so
a client generated from the schema cannot exceed them. The schema's strategy
enum likewise lists only the strategies this deployment can run (a trained
strategy needs its trained part under models/gateway/). Each dialect's record
(api/dialect.py) says which schema is its request and what it calls the documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from keyrank.config import Settings
from keyrank.errors import InvalidRequest, LimitExceeded
from keyrank.strategies import REGISTRY

if TYPE_CHECKING:
    from keyrank.api.dialect import Dialect


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
    return [
        spec.name for spec in REGISTRY.values() if all((settings.gateway_dir / part).exists() for part in spec.trained_parts)
    ]
