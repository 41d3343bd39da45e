"""GET /v1/models: the served models in OpenAI's list shape, for the discovery calls of OpenAI, vLLM and
Infinity clients. Its errors are keyrank's own."""

from __future__ import annotations

from fastapi import APIRouter, Request

from keyrank.api.body import StrictJsonRoute
from keyrank.api.dialect import Dialect
from keyrank.api.routes import prepared_at
from keyrank.api.served import served_models
from keyrank.schemas import ModelList

router = APIRouter(tags=["discovery"], route_class=StrictJsonRoute)

DIALECT = Dialect(name="openai", router=router)


@router.get("/v1/models", response_model=ModelList,
            summary="The served models, OpenAI's list shape, each with the runtime and precision that score it.")
async def models_openai(request: Request) -> ModelList:
    served = await served_models(request.app)
    return ModelList(data=[{"id": name, "created": prepared_at(request, name), **what.as_dict()} for name, what in served.items()])
