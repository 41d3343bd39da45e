"""Hugging Face text-embeddings-inference's routes under /tei (POST /tei/rerank, GET /tei/info): TEI's
clients take a base URL, so they drop in with keyrank's plus ``/tei``.

It ranks with the default strategy and selector, by the vendor rules (vendor.py): scores are the sigmoid
of keyrank's unless ``raw_scores``; ``return_evidence`` adds the evidence spans and coverage to each result.
TEI's request calls the documents ``texts``, and so do the errors.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from keyrank import __version__
from keyrank.api.body import StrictJsonRoute
from keyrank.api.dialect import Dialect
from keyrank.api.limits import as_sent
from keyrank.api.ranking import rank
from keyrank.api.routes import coverage, model_id, model_ids, served_model
from keyrank.api.routes.vendor import requested_model, vendor_headers, vendor_score
from keyrank.api.served import served_models
from keyrank.errors import InvalidRequest
from keyrank.reranker import RerankOptions
from keyrank.schemas import TeiErrorResponse, TeiInfo, TeiRerankRequest, TeiRerankResponse

router = APIRouter(tags=["drop-in (TEI)"], route_class=StrictJsonRoute)

_TEI_ERROR_TYPES = {429: "Overloaded", 503: "Unhealthy"}
"""TEI's error_type of a status; other 4xx are "Validation", other 5xx "Backend"."""


def tei_error(status: int, error: dict[str, Any]) -> dict[str, Any]:
    """TEI's error answer: its ``error`` is the message, ``error_type`` TEI's kind of the status."""
    kind = _TEI_ERROR_TYPES.get(status, "Validation" if status < 500 else "Backend")
    return {"error": error["message"], "error_type": kind, "field": error.get("field"), "request_id": error["request_id"]}


DIALECT = Dialect(
    name="tei", router=router, request=TeiRerankRequest, error_model=TeiErrorResponse, error_body=tei_error,
    prefix="/tei", documents_field="texts",
)


@router.post("/rerank", response_model=TeiRerankResponse, responses=DIALECT.errors,
             summary="Hugging Face text-embeddings-inference rerank shape.")
async def rerank_tei(body: TeiRerankRequest, request: Request) -> Response:
    try:
        ranking = await rank(request, body.query, body.texts, RerankOptions(), requested_model(body))
    except InvalidRequest as exc:  # limits and admission name "documents": TEI's callers sent "texts"
        raise as_sent(exc, DIALECT.documents_field) from None
    results = []
    for r in ranking.results:
        result: dict[str, Any] = {"index": r.index, "score": vendor_score(r, body.raw_scores)}
        if body.return_text:
            result["text"] = body.texts[r.index]
        if body.return_evidence:
            result.update(coverage(r))
        results.append(result)
    return JSONResponse(results, headers=vendor_headers(ranking, body, served_model(request, ranking)))


@router.get("/info", response_model=TeiInfo, summary="TEI's model and limits.")
async def info_tei(request: Request) -> TeiInfo:
    settings = request.app.state.settings
    served = await served_models(request.app)
    return TeiInfo(
        model_id=model_id(request),
        models=model_ids(request),
        model_dtype=next(iter(served.values())).precision if served else "unknown",  # the default model's
        model_type={"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}},
        max_concurrent_requests=settings.triton_max_in_flight * settings.workers,
        max_input_length=settings.max_sequence_length,
        max_batch_tokens=settings.triton_batch_size * settings.max_sequence_length,
        max_client_batch_size=settings.max_documents,
        tokenization_workers=settings.workers,
        version=__version__,
    )
