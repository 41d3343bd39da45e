"""One record per client dialect (api/dialect.py): each record's error shape answers in its documented error
model, its request names the documents field it declares, and a dialect added to the list is mounted,
guarded by the API key, answers its errors in its own shape and carries the limits in the OpenAPI schema:
nothing else has to name it. No model is needed: nothing here is ranked."""

from __future__ import annotations

import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient
from keyrank.api import app as app_module
from keyrank.api import create_app
from keyrank.api.app import DIALECTS
from keyrank.api.body import StrictJsonRoute
from keyrank.api.dialect import Dialect
from keyrank.config import Settings
from keyrank.schemas.common import VendorRequest, Wire


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@pytest.mark.parametrize("status", [401, 422, 429, 500, 503])
@pytest.mark.parametrize("field", [None, "documents[0].text"])
def test_every_dialects_error_body_is_its_documented_error_model(dialect, status, field):
    error = {"type": "invalid_request", "message": "what went wrong", "request_id": "r1"}
    if field is not None:
        error["field"] = field
    dialect.error_model.model_validate(dialect.error_body(status, error))


@pytest.mark.parametrize("dialect", [d for d in DIALECTS if d.request is not None], ids=lambda d: d.name)
def test_every_dialects_request_has_the_documents_field_its_record_names(dialect):
    assert {"query", dialect.documents_field} <= set(dialect.request.model_fields)


def test_every_route_belongs_to_one_dialect_and_no_two_share_a_prefix():
    paths = [d.prefix + route.path for d in DIALECTS for route in d.router.routes]
    prefixes = [d.prefix for d in DIALECTS if d.prefix]
    assert len(paths) == len(set(paths)) and len(prefixes) == len(set(prefixes))


class ToyRequest(VendorRequest):
    """A made-up client's request."""

    query: str
    """The query."""
    passages: list[str]
    """The documents, as this client calls them."""


class ToyError(Wire):
    """A made-up client's error answer."""

    problem: str
    """What went wrong."""


def _toy_dialect() -> Dialect:
    router = APIRouter(route_class=StrictJsonRoute)

    @router.post("/rank")
    async def rank_toy(body: ToyRequest) -> dict:
        return {"passages": len(body.passages)}

    return Dialect(name="toy", router=router, request=ToyRequest, error_model=ToyError,
                   error_body=lambda status, error: {"problem": error["message"]}, prefix="/toy", documents_field="passages")


def test_a_dialect_added_to_the_list_is_mounted_guarded_and_answers_in_its_own_shape(monkeypatch, tmp_path):
    monkeypatch.setattr(app_module, "DIALECTS", (*DIALECTS, _toy_dialect()))
    client = TestClient(create_app(Settings(model_dir=tmp_path, api_key="k", max_documents=7)))  # no lifespan: no model
    refused = client.post("/toy/rank", json={"query": "q", "passages": ["a"]})
    assert refused.status_code == 401 and refused.json() == {"problem": "missing API key: send Authorization: Bearer <key>"}
    assert client.get("/toy/nothing").json() == {"problem": "Not Found"}
    answered = client.post("/toy/rank", json={"query": "q", "passages": ["a", "b"]}, headers={"Authorization": "Bearer k"})
    assert answered.json() == {"passages": 2}
    schema = client.get("/openapi.json").json()
    assert schema["components"]["schemas"]["ToyRequest"]["properties"]["passages"]["maxItems"] == 7
    assert schema["paths"]["/toy/rank"]["post"]["security"] == [{"bearer": []}]
