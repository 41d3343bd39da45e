"""POST /rerank: keyrank's own shape (strategy, selector, evidence, usage, timings), and its own errors."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from keyrank.api.body import StrictJsonRoute
from keyrank.api.dialect import Dialect
from keyrank.api.ranking import rank
from keyrank.api.routes import IGNORED_HEADER, served_model, timing_header
from keyrank.reranker import RerankOptions
from keyrank.schemas import (
    DocumentOut,
    EvidenceOut,
    RerankRequest,
    RerankResponse,
    RerankResult,
    TimingsOut,
    UsageOut,
)

if TYPE_CHECKING:
    from keyrank.reranker import RankedDocument

router = APIRouter(tags=["rerank"], route_class=StrictJsonRoute)

DIALECT = Dialect(name="native", router=router, request=RerankRequest)


@router.post("/rerank", response_model=RerankResponse, responses=DIALECT.errors, summary="Rank documents; keyrank's own shape.")
async def rerank(body: RerankRequest, request: Request) -> Response:
    texts = body.texts()
    options = RerankOptions(
        strategy=body.strategy, selector=body.selector, top_n=body.top_n, max_tokens_per_doc=body.max_tokens_per_doc
    )
    ranking = await rank(request, body.query, texts, options, body.model)
    ids = body.ids()
    results = [_result(r, texts[r.index], ids[r.index], body) for r in ranking.results]
    answer = RerankResponse(
        model=served_model(request, ranking),
        strategy=ranking.strategy,
        selector=ranking.selector,
        results=results,
        usage=UsageOut(**dataclasses.asdict(ranking.usage)),
        timings_ms=TimingsOut(**ranking.timings_ms),
    )
    content = answer.model_dump(mode="json", exclude_none=True)
    content["selector"] = ranking.selector  # null for strategies without a selector, but always present
    headers = timing_header(ranking)
    if body.model is not None and body.model != answer.model:  # one model served: it ranked, as on the vendor routes
        headers[IGNORED_HEADER] = "model"
    return JSONResponse(content, headers=headers)


def _result(ranked: RankedDocument, text: str, doc_id: str | None, body: RerankRequest) -> RerankResult:
    evidence = None
    if body.return_evidence:
        evidence = [
            EvidenceOut(start=e.start, end=e.end, text=text[e.start : e.end] if body.return_documents else None)
            for e in ranked.evidence
        ]
    return RerankResult(
        index=ranked.index,
        id=doc_id,
        relevance_score=ranked.score,
        evidence=evidence,
        document=DocumentOut(text=text) if body.return_documents else None,
        truncated=ranked.truncated,
        read_tokens=ranked.read_tokens,
        document_tokens=ranked.document_tokens,
    )
