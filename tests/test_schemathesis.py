"""Schemathesis over the OpenAPI schema: generated requests (valid and invalid, at most 30 per
operation and phase) sent over real HTTP to a gateway on the session's Triton get no server error
and answers that conform to the schema (status codes, content types, headers, bodies).

The gateway's limits are set small, so the schema's maxItems/maxLength bound what is generated
and every valid request is cheap to score. The schema is the app's own (``app.openapi()``), read
at import: schemathesis parametrizes at collection time, before any fixture exists.

Derandomized (here and by the ``keyrank`` hypothesis profile in conftest.py): every run sends the
same requests, so a failure is reproducible; one found is kept as an explicit case in
tests/test_hostile_input.py (a query of "\u001f" once failed here at random).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from keyrank.api import create_app
from keyrank.config import Settings
from keyrank.strategies import REGISTRY
from live_gateway import live_gateway

schemathesis = pytest.importorskip("schemathesis")

pytestmark = pytest.mark.triton

LIMITS = {"max_documents": 4, "max_document_chars": 300, "max_query_chars": 100}
REFUSED = {name for name, spec in REGISTRY.items() if spec.trained_parts or spec.cut.needs}
"""Strategies the session's model answers with a 422 naming why (no trained PARADE part; a 512-token model for
longp: tests/test_api_contract.py, tests/test_strategy_registry.py): valid names, not valid work for it."""


def _runnable_here(node):
    """The app's schema with the strategies ``REFUSED`` left out of every enum that lists them."""
    if isinstance(node, dict):
        return {k: ([v for v in value if v not in REFUSED] if k == "enum" else _runnable_here(value)) for k, value in node.items()}
    if isinstance(node, list):
        return [_runnable_here(item) for item in node]
    return node


schema = schemathesis.openapi.from_dict(_runnable_here(create_app(Settings(model_dir=Path("unused"), **LIMITS)).openapi()))


@pytest.fixture(scope="module")
def small_gateway(prepared_models, embedded_triton):
    settings_ = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url, **LIMITS)
    with live_gateway(settings_) as url:
        yield url


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
def test_generated_requests_get_no_server_error_and_conforming_answers(case, small_gateway):
    case.call_and_validate(base_url=small_gateway)
