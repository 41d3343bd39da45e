"""Drop-in routes for the clients of the other self-hosted rerankers, each under its own prefix (their
clients take a base URL; POST /rerank stays keyrank's own shape):

- POST /tei/rerank, GET /tei/info: Hugging Face text-embeddings-inference;
- POST /infinity/rerank, GET /infinity/models: michaelfeil/infinity;
- GET /v1/models: OpenAI-style discovery (vLLM, Infinity, OpenAI clients).

They rank with the default strategy and selector, like the Jina/Cohere routes, and share their rules
(compat.py): unknown fields and fields that change nothing are named in ``X-Keyrank-Ignored-Fields``;
scores are the sigmoid of keyrank's unless ``raw_scores``; ``return_evidence`` adds the evidence spans
and coverage to each result.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from keyrank import __version__
from keyrank.api.body import StrictJsonRoute
from keyrank.api.errors import INFINITY_ERRORS, TEI_ERRORS
from keyrank.api.ranking import rank
from keyrank.api.routes import coverage, model_id, model_ids, served_model, sigmoid
from keyrank.api.routes.compat import requested_model, vendor_headers
from keyrank.errors import InvalidRequest
from keyrank.reranker import RerankOptions
from keyrank.schemas import (
    InfinityModels,
    InfinityRerankRequest,
    InfinityRerankResponse,
    ModelList,
    TeiInfo,
    TeiRerankRequest,
    TeiRerankResponse,
)

if TYPE_CHECKING:
    from keyrank.reranker import RankedDocument

router = APIRouter(route_class=StrictJsonRoute)

# --------------------------------------------------------------------------- TEI


@router.post("/tei/rerank", response_model=TeiRerankResponse, responses=TEI_ERRORS, tags=["drop-in (TEI)"],
             summary="Hugging Face text-embeddings-inference rerank shape.")
async def rerank_tei(body: TeiRerankRequest, request: Request) -> Response:
    try:
        ranking = await rank(request, body.query, body.texts, RerankOptions(), requested_model(body))
    except InvalidRequest as exc:  # limits and admission name "documents": TEI's callers sent "texts"
        raise _named_texts(exc) from None
    results = []
    for r in ranking.results:
        result: dict[str, Any] = {"index": r.index, "score": _score(r, body.raw_scores)}
        if body.return_text:
            result["text"] = body.texts[r.index]
        if body.return_evidence:
            result.update(coverage(r))
        results.append(result)
    return JSONResponse(results, headers=vendor_headers(ranking, body, served_model(request, ranking)))


@router.get("/tei/info", response_model=TeiInfo, tags=["drop-in (TEI)"], summary="TEI's model and limits.")
async def info_tei(request: Request) -> TeiInfo:
    settings = request.app.state.settings
    return TeiInfo(
        model_id=model_id(request),
        models=model_ids(request),
        model_dtype="float32",
        model_type={"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}},
        max_concurrent_requests=settings.triton_max_in_flight * settings.workers,
        max_input_length=settings.max_sequence_length,
        max_batch_tokens=settings.triton_batch_size * settings.max_sequence_length,
        max_client_batch_size=settings.max_documents,
        tokenization_workers=settings.workers,
        version=__version__,
    )


# --------------------------------------------------------------------------- Infinity


@router.post("/infinity/rerank", response_model=InfinityRerankResponse, responses=INFINITY_ERRORS,
             tags=["drop-in (Infinity)"], summary="Infinity's rerank shape.")
async def rerank_infinity(body: InfinityRerankRequest, request: Request) -> Response:
    ranking = await rank(request, body.query, body.documents, RerankOptions(top_n=body.top_n), requested_model(body))
    results = []
    for r in ranking.results:
        result: dict[str, Any] = {"relevance_score": _score(r, body.raw_scores), "index": r.index}
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


@router.get("/infinity/models", response_model=InfinityModels, tags=["drop-in (Infinity)"], summary="Infinity's model list.")
async def models_infinity(request: Request) -> InfinityModels:
    return InfinityModels(data=[{"id": name, "created": _prepared_at(request, name)} for name in model_ids(request)])


# --------------------------------------------------------------------------- OpenAI-style discovery


@router.get("/v1/models", response_model=ModelList, tags=["discovery"], summary="The served models, OpenAI's list shape.")
async def models_openai(request: Request) -> ModelList:
    return ModelList(data=[{"id": name, "created": _prepared_at(request, name)} for name in model_ids(request)])


def _named_texts(exc: InvalidRequest) -> InvalidRequest:
    """The same error, its field ``documents...`` called ``texts...`` as in TEI's request."""
    field = exc.field or ""
    if field.startswith("documents"):
        exc.field = "texts" + field[len("documents"):]
        exc.args = (str(exc).replace(field, exc.field, 1), *exc.args[1:])
    return exc


def _score(ranked: RankedDocument, raw: bool) -> float:
    """keyrank's score with ``raw_scores``, else its sigmoid (as TEI and Infinity answer by default)."""
    return ranked.score if raw else sigmoid(ranked.score)


def _prepared_at(request: Request, name: str) -> int:
    """Unix time the served model ``name`` was prepared: its manifest's modification time (0 if it has none)."""
    rerankers = request.app.state.rerankers
    reranker = rerankers[name] if rerankers else request.app.state.reranker
    manifest = reranker.settings.gateway_dir / "manifest.json"
    try:
        return int(manifest.stat().st_mtime)
    except OSError:
        return 0
