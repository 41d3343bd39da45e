"""michaelfeil/infinity's routes under /infinity (POST /infinity/rerank, GET /infinity/models): its clients
take a base URL, so they drop in with keyrank's plus ``/infinity``.

It ranks with the default strategy and selector, by the vendor rules (vendor.py): scores are the sigmoid
of keyrank's unless ``raw_scores``; ``return_evidence`` adds the evidence spans and coverage to each result.
Errors carry FastAPI's ``detail`` list, which Infinity's generated client parses.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from keyrank.api.body import StrictJsonRoute
from keyrank.api.dialect import Dialect
from keyrank.api.ranking import rank
from keyrank.api.routes import coverage, model_ids, prepared_at, served_model
from keyrank.api.routes.vendor import requested_model, vendor_headers, vendor_score
from keyrank.reranker import RerankOptions
from keyrank.schemas import InfinityErrorResponse, InfinityModels, InfinityRerankRequest, InfinityRerankResponse

router = APIRouter(tags=["drop-in (Infinity)"], route_class=StrictJsonRoute)


def infinity_error(status: int, error: dict[str, Any]) -> dict[str, Any]:
    """Infinity's error answer: one FastAPI ``detail`` entry locating the field ("body" when none)."""
    field = error.get("field")
    loc = ["body", *(field.split(".") if field else [])]
    return {"detail": [{"loc": loc, "msg": error["message"], "type": error["type"]}], "message": error["message"], "error": error}


DIALECT = Dialect(
    name="infinity", router=router, request=InfinityRerankRequest, error_model=InfinityErrorResponse,
    error_body=infinity_error, prefix="/infinity",
)


@router.post("/rerank", response_model=InfinityRerankResponse, responses=DIALECT.errors, summary="Infinity's rerank shape.")
async def rerank_infinity(body: InfinityRerankRequest, request: Request) -> Response:
    ranking = await rank(request, body.query, body.documents, RerankOptions(top_n=body.top_n), requested_model(body))
    results = []
    for r in ranking.results:
        result: dict[str, Any] = {"relevance_score": vendor_score(r, body.raw_scores), "index": r.index}
        if body.return_documents:
            result["document"] = body.documents[r.index]
        if body.return_evidence:
            result.update(coverage(r))
        results.append(result)
    model = served_model(request, ranking)
    answer = {
        "object": "rerank",
        "results": results,
        "model": model,
        "usage": {"prompt_tokens": ranking.usage.scored_tokens, "total_tokens": ranking.usage.scored_tokens},
        "id": request.state.request_id,
        "created": int(time.time()),
    }
    return JSONResponse(answer, headers=vendor_headers(ranking, body, model))


@router.get("/models", response_model=InfinityModels, summary="Infinity's model list.")
async def models_infinity(request: Request) -> InfinityModels:
    return InfinityModels(data=[{"id": name, "created": prepared_at(request, name)} for name in model_ids(request)])
