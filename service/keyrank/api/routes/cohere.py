"""POST /v2/rerank: Cohere's v2 shape, for Cohere's clients with keyrank's base URL; and what Cohere's v1
shape on /v1/rerank (jina.py) shares with it: object documents read by ``rank_fields``, results, meta.

It ranks with the default strategy and selector, by the vendor rules (vendor.py). ``return_evidence:
true`` (keyrank's extension) adds each result's evidence spans and coverage (routes/__init__.py's
``coverage``). Errors carry Cohere's ``message``.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from keyrank.api.body import StrictJsonRoute
from keyrank.api.dialect import Dialect
from keyrank.api.ranking import rank
from keyrank.api.routes import coverage, served_model, sigmoid
from keyrank.api.routes.vendor import requested_model, vendor_headers
from keyrank.errors import InvalidRequest
from keyrank.reranker import RerankOptions
from keyrank.schemas import CohereErrorResponse, CohereRerankRequest, CohereRerankResponse

if TYPE_CHECKING:
    from keyrank.reranker import Ranking

router = APIRouter(tags=["drop-in (Jina, Cohere)"], route_class=StrictJsonRoute)


def cohere_error(status: int, error: dict[str, Any]) -> dict[str, Any]:
    """Cohere's error answer: the request id and ``message``, which its clients read."""
    return {"id": error["request_id"], "message": error["message"], "error": error}


DIALECT = Dialect(
    name="cohere", router=router, request=CohereRerankRequest, error_model=CohereErrorResponse, error_body=cohere_error
)


@router.post("/v2/rerank", response_model=CohereRerankResponse, responses=DIALECT.errors, summary="Cohere v2 rerank shape.")
async def rerank_v2(body: CohereRerankRequest, request: Request) -> Response:
    texts = [document_text(d, body.rank_fields, i) for i, d in enumerate(body.documents)]
    options = RerankOptions(top_n=body.top_n, max_tokens_per_doc=body.max_tokens_per_doc, max_windows_per_doc=body.max_chunks_per_doc)
    ranking = await rank(request, body.query, texts, options, requested_model(body))
    answer = {
        "id": request.state.request_id,
        "results": cohere_results(ranking, body.documents, body.return_documents, body.return_evidence),
        "meta": cohere_meta("2", len(texts)),
    }
    return JSONResponse(answer, headers=vendor_headers(ranking, body, served_model(request, ranking)))


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


def cohere_results(ranking: Ranking, documents: list[str | dict[str, Any]], with_documents: bool, with_evidence: bool
                   ) -> list[dict[str, Any]]:
    """The ranked documents as Jina's and Cohere's results: index, relevance_score (a sigmoid), the document."""
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


def cohere_meta(version: str, n_documents: int) -> dict[str, Any]:
    """Cohere's meta block of API ``version``."""
    # Cohere bills one search unit per query and started 100 documents.
    return {"api_version": {"version": version}, "billed_units": {"search_units": max(1, math.ceil(n_documents / 100))}}
