"""What a client dialect is: one record per dialect (``Dialect``) with the shape and documentation of its
error answers, and the path lookup every error answer, the API key and the request count use (``Dialects``).

A dialect is its wire types (schemas/), its routes with their thin translation to ``RerankOptions`` and
its record (api/routes/), and one entry in api/app.py's ``DIALECTS``. Nothing else names it: app.py mounts
its router, errors.py answers in its error shape, limits.py writes its limits into its request schema.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from pydantic import BaseModel

from keyrank.schemas import ErrorResponse

_DESCRIPTIONS = {  # the error answers every rerank route documents, by status
    400: "Body is not JSON (RFC 8259: no NaN, no duplicate keys, at most 64 levels deep); the message names the parse error, line and column.",
    401: "Missing or wrong API key (only when KEYRANK_API_KEY is set); checked before the body is read.",
    413: "Body larger than KEYRANK_MAX_BODY_BYTES.",
    415: "Body sent with a Content-Encoding (gzip, ...): send it uncompressed.",
    422: "Invalid field or a configured limit exceeded; the message names it.",
    429: "At capacity (KEYRANK_MAX_QUEUED_SEQUENCES); retry after Retry-After seconds.",
    503: "Scoring unavailable (Triton down, not ready or past the deadline); retry after Retry-After seconds.",
}


def documented_errors(model: type) -> dict[int | str, dict[str, Any]]:
    """The error answers of a route, for its OpenAPI ``responses``."""
    return {code: {"model": model, "description": text} for code, text in _DESCRIPTIONS.items()}


ErrorShape = Callable[[int, dict[str, Any]], dict[str, Any]]
"""A dialect's error answer from the status and keyrank's structured error (``{type, message, request_id}``,
with ``field`` and ``details`` when known)."""


def keyrank_error(status: int, error: dict[str, Any]) -> dict[str, Any]:
    """keyrank's own error answer."""
    return {"error": error}


@dataclass(frozen=True)
class Dialect:
    """One client dialect: the routes its clients call, its wire types, its error answer, its field names."""

    name: str
    """Whose clients speak it: native, jina, cohere, tei, infinity, openai."""
    router: APIRouter
    """Its routes, their paths without ``prefix``."""
    request: type[BaseModel] | None = None
    """Its rerank request's wire type, where app.py writes the served model names and limits.py the limits;
    None for a dialect that only lists models."""
    error_model: type[BaseModel] = ErrorResponse
    """Wire type of its error answers, documented on its routes (``errors``)."""
    error_body: ErrorShape = keyrank_error
    """Its error answer's body, from the status and keyrank's structured error."""
    prefix: str = ""
    """URL prefix of its routes, added when app.py mounts them. An error on any path under it, an unknown
    one too, is answered in its shape; empty when it shares its paths' first segment with other dialects
    (/v1/rerank, /v1/models)."""
    documents_field: str = "documents"
    """Its request's name for the documents (TEI's: texts), for limit messages and the schema's maxItems."""

    @property
    def errors(self) -> dict[int | str, dict[str, Any]]:
        """Its error answers, for its routes' OpenAPI ``responses``."""
        return documented_errors(self.error_model)

    @property
    def rerank_paths(self) -> tuple[str, ...]:
        """Paths of its POST routes, the ones that rank: behind the API key, counted, marked secured."""
        return tuple(self.prefix + route.path for route in self.router.routes if isinstance(route, APIRoute) and "POST" in route.methods)


class Dialects:
    """The dialects an app speaks, and the one a URL path belongs to."""

    def __init__(self, dialects: Sequence[Dialect]):
        self.all = tuple(dialects)
        """In mounting order."""
        self.rerank_paths = frozenset(path for dialect in self.all for path in dialect.rerank_paths)
        """Every dialect's ``rerank_paths``."""
        self._by_path = {dialect.prefix + route.path: dialect for dialect in self.all for route in dialect.router.routes}

    def of(self, path: str) -> Dialect | None:
        """The dialect of a route's path, or of any path under its prefix; None for the probes, the docs and
        unknown paths outside every prefix."""
        found = self._by_path.get(path)
        if found is None:
            found = next((d for d in self.all if d.prefix and path.startswith(d.prefix + "/")), None)
        return found
