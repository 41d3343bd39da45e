"""The configured request limits, checked after parsing and before any work (never in the wire types).

Each answer is a 422 that names the field and the setting; the same limits are
written into the OpenAPI schema as maxItems/maxLength (``openapi_limits``), so
a client generated from the schema cannot exceed them. The schema's strategy
enum likewise lists only the strategies this deployment can run (a trained
strategy needs its trained part under models/gateway/).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keyrank.config import Settings
from keyrank.errors import LimitExceeded
from keyrank.strategies import REGISTRY

REQUEST_SCHEMAS = ("RerankRequest", "V1RerankRequest", "CohereRerankRequest", "TeiRerankRequest", "InfinityRerankRequest")
"""OpenAPI components whose ``query`` and ``documents`` (TEI: ``texts``) the limits apply to."""


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


def openapi_limits(schema: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Write the limits into the request schemas: documents maxItems, query and text maxLength."""
    components = schema.get("components", {}).get("schemas", {})
    for name in REQUEST_SCHEMAS:
        properties = components.get(name, {}).get("properties", {})
        if "query" in properties:
            properties["query"]["maxLength"] = settings.max_query_chars
        for key in ("documents", "texts"):
            if key not in properties:
                continue
            documents = properties[key]
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
