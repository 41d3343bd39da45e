"""Drop-in routes: existing Jina and Cohere clients switch to keyrank by changing their base URL.

- POST /v1/rerank: Jina's shape, and Cohere's v1 shape (which extends it: rank_fields,
  max_chunks_per_doc, object documents). The answer carries both vendors' fields (Jina: model,
  usage; Cohere v1: id, meta) and each client reads its own. Errors carry ``detail`` (Jina) and
  ``message`` (Cohere).
- POST /v2/rerank: Cohere's v2 shape; errors carry ``message``.

Both rank with the default strategy and selector. Every field the vendors' APIs and SDKs send is
accepted; those that change nothing here (``priority``, ``max_chunks_per_doc`` unless the strategy cuts windows,
``return_embeddings``, a ``model`` other than the served one, fields unknown to us) are named in
the ``X-Keyrank-Ignored-Fields`` header. With several models served (KEYRANK_MODELS) ``model`` picks one
and a name not served is a 422 listing them (api/ranking.py's ``choose_model``). Scores are the sigmoid of keyrank's, in [0, 1] as these
clients expect, in the same order. ``return_evidence: true`` (keyrank's extension) adds each result's
evidence spans and coverage (routes/__init__.py's ``coverage``).

``ignored_fields`` and ``vendor_headers`` serve every vendor dialect (dialects.py's TEI and Infinity too).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from keyrank.api.body import StrictJsonRoute
from keyrank.api.errors import V1_ERRORS, V2_ERRORS
from keyrank.api.ranking import rank
from keyrank.api.routes import coverage, served_model, sigmoid, timing_header
from keyrank.errors import InvalidRequest
from keyrank.reranker import RerankOptions
from keyrank.strategies import REGISTRY
from keyrank.schemas import (
    CohereRerankRequest,
    CohereRerankResponse,
    V1RerankRequest,
    V1RerankResponse,
)
from keyrank.schemas.common import VendorRequest

if TYPE_CHECKING:
    from keyrank.reranker import Ranking

router = APIRouter(tags=["drop-in (Jina, Cohere)"], route_class=StrictJsonRoute)

IGNORED_HEADER = "X-Keyrank-Ignored-Fields"
_MAX_NAMED = 32
"""At most this many ignored fields are named in the header (it must stay a header)."""
_MAX_NAME_CHARS = 64
"""Each name is cut to this many header characters (percent-encoded), ending in "...": 32 names of
20k characters made a 640 KB header that httpx and curl refuse to read."""


@router.post(
    "/v1/rerank", response_model=V1RerankResponse, responses=V1_ERRORS, summary="Jina AI and Cohere v1 rerank shape."
)
async def rerank_v1(body: V1RerankRequest, request: Request) -> Response:
    texts = [document_text(d, body.rank_fields, i) for i, d in enumerate(body.documents)]
    options = RerankOptions(top_n=body.top_n, max_tokens_per_doc=body.max_tokens_per_doc, max_windows_per_doc=body.max_chunks_per_doc)
    ranking = await rank(request, body.query, texts, options, requested_model(body))
    model = served_model(request, ranking)
    answer = {
        "id": request.state.request_id,
        "model": model,
        "usage": {"total_tokens": ranking.usage.scored_tokens},
        "results": _results(ranking, body.documents, body.return_documents, body.return_evidence),
        "meta": _meta("1", len(texts)),
    }
    return JSONResponse(answer, headers=vendor_headers(ranking, body, model))


@router.post("/v2/rerank", response_model=CohereRerankResponse, responses=V2_ERRORS, summary="Cohere v2 rerank shape.")
async def rerank_v2(body: CohereRerankRequest, request: Request) -> Response:
    texts = [document_text(d, body.rank_fields, i) for i, d in enumerate(body.documents)]
    options = RerankOptions(top_n=body.top_n, max_tokens_per_doc=body.max_tokens_per_doc, max_windows_per_doc=body.max_chunks_per_doc)
    ranking = await rank(request, body.query, texts, options, requested_model(body))
    answer = {
        "id": request.state.request_id,
        "results": _results(ranking, body.documents, body.return_documents, body.return_evidence),
        "meta": _meta("2", len(texts)),
    }
    return JSONResponse(answer, headers=vendor_headers(ranking, body, served_model(request, ranking)))


def requested_model(body: VendorRequest) -> str | None:
    """The model a vendor request names; None for none or a client's placeholder (``unnamed_models``)."""
    named = getattr(body, "model", None)
    return None if named is None or named in type(body).unnamed_models else named


def document_text(document: str | dict[str, Any], rank_fields: list[str] | None, index: int) -> str:
    """The text a vendor document is ranked by: the string; an object's ``rank_fields`` as "field: value"
    lines in that order (as Cohere v1 reads them); else, or when it has none of them, its ``text``."""
    if isinstance(document, str):
        return document
    field = f"documents[{index}]"
    lines = [f"{name}: {_as_text(document[name])}" for name in rank_fields or () if name in document]
    if lines:
        return "\n".join(lines)
    text = document.get("text")
    if not isinstance(text, str):
        wanted = f"none of the rank_fields {rank_fields} and " if rank_fields else ""
        raise InvalidRequest(
            f"{field}: {wanted}no string `text` field; only text documents are supported", field=field
        )
    return text


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _results(ranking: Ranking, documents: list[str | dict[str, Any]], with_documents: bool, with_evidence: bool
             ) -> list[dict[str, Any]]:
    results = []
    for r in ranking.results:
        result: dict[str, Any] = {"index": r.index, "relevance_score": sigmoid(r.score)}
        if with_documents:
            sent = documents[r.index]
            result["document"] = {"text": sent} if isinstance(sent, str) else sent
        if with_evidence:
            result.update(coverage(r))
        results.append(result)
    return results


def _meta(version: str, n_documents: int) -> dict[str, Any]:
    # Cohere bills one search unit per query and started 100 documents.
    return {"api_version": {"version": version}, "billed_units": {"search_units": max(1, math.ceil(n_documents / 100))}}


def ignored_fields(body: VendorRequest, model: str, strategy: str | None = None) -> list[str]:
    """Fields the caller sent that changed nothing: the dialect's vendor-only ones (``ignored_when_sent``),
    unknown ones, another model's name (not a client's placeholder, ``unnamed_models``), ``max_chunks_per_doc``
    when the strategy served cuts no windows (keyb2, firstp)."""
    ignored = set(type(body).ignored_when_sent)
    if strategy is not None and not REGISTRY[strategy].windowed:
        ignored.add("max_chunks_per_doc")
    names = sorted((body.model_fields_set & ignored) | set(body.model_extra or {}))
    named = getattr(body, "model", None) if "model" in type(body).model_fields else None  # else: an unknown field
    if named is not None and named != model and named not in type(body).unnamed_models:
        names.insert(0, "model")
    return names


def _header_name(name: str) -> str:
    """``name`` percent-encoded, cut to _MAX_NAME_CHARS at a character boundary, with "..." when cut."""
    encoded = quote(name[: _MAX_NAME_CHARS + 1], safe="_-.")
    if len(encoded) <= _MAX_NAME_CHARS:
        return encoded
    kept = ""
    for char in name:
        piece = quote(char, safe="_-.")
        if len(kept) + len(piece) > _MAX_NAME_CHARS - 3:
            break
        kept += piece
    return kept + "..."


def vendor_headers(ranking: Ranking, body: VendorRequest, model: str) -> dict[str, str]:
    """Server-Timing, and X-Keyrank-Ignored-Fields when the caller sent fields that changed nothing."""
    headers = timing_header(ranking)
    ignored = ignored_fields(body, model, ranking.strategy)
    if ignored:
        # Unknown field names are the caller's text: percent-encoded so they stay one header line.
        named = [_header_name(name) for name in ignored[:_MAX_NAMED]]
        more = [f"... ({len(ignored) - _MAX_NAMED} more)"] if len(ignored) > _MAX_NAMED else []
        headers[IGNORED_HEADER] = ", ".join(named + more)
    return headers
