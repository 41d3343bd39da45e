"""POST /v1/rerank: Jina's shape, and Cohere's v1 shape which extends it (rank_fields, max_chunks_per_doc,
object documents): existing Jina and Cohere v1 clients switch to keyrank by changing their base URL.

The answer carries both vendors' fields (Jina: model, usage; Cohere v1: id, meta) and each client reads
its own; the documents, results and meta are Cohere's (cohere.py). It ranks with the default strategy and
selector, by the vendor rules (vendor.py). Errors carry ``detail`` (Jina) and ``message`` (Cohere).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from keyrank.api.body import StrictJsonRoute
from keyrank.api.dialect import Dialect
from keyrank.api.ranking import rank
from keyrank.api.routes import served_model
from keyrank.api.routes.cohere import cohere_meta, cohere_results, document_text
from keyrank.api.routes.vendor import requested_model, vendor_headers
from keyrank.reranker import RerankOptions
from keyrank.schemas import V1ErrorResponse, V1RerankRequest, V1RerankResponse

router = APIRouter(tags=["drop-in (Jina, Cohere)"], route_class=StrictJsonRoute)


def jina_error(status: int, error: dict[str, Any]) -> dict[str, Any]:
    """The error answer of Jina's and Cohere v1's clients: Jina's read ``detail``, Cohere's ``message``."""
    return {"detail": error["message"], "message": error["message"], "error": error}


DIALECT = Dialect(name="jina", router=router, request=V1RerankRequest, error_model=V1ErrorResponse, error_body=jina_error)


@router.post(
    "/v1/rerank", response_model=V1RerankResponse, responses=DIALECT.errors, summary="Jina AI and Cohere v1 rerank shape."
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
        "results": cohere_results(ranking, body.documents, body.return_documents, body.return_evidence),
        "meta": cohere_meta("1", len(texts)),
    }
    return JSONResponse(answer, headers=vendor_headers(ranking, body, model))
