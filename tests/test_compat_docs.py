"""The OpenAPI page tells the truth about the vendor routes' fields, on every dialect (Jina/Cohere v1, Cohere
v2, TEI, Infinity): a field whose description says it is ignored is named in X-Keyrank-Ignored-Fields
(``ignored_fields``, the header's one source), and a field whose description says it acts is not."""

from __future__ import annotations

import pytest
from keyrank.api.routes.vendor import ignored_fields
from keyrank.schemas import CohereRerankRequest, V1RerankRequest
from keyrank.schemas import InfinityRerankRequest, TeiRerankRequest
from keyrank.schemas.infinity import INFINITY_DEFAULT_MODEL
from keyrank.strategies import REGISTRY

# A value each field accepts (the required query/documents/model are always sent).
VALUES = {"top_n": 1, "return_documents": True, "rank_fields": ["text"], "max_tokens_per_doc": 100,
          "max_chunks_per_doc": 2, "return_embeddings": True, "priority": 1, "return_evidence": True,
          "raw_scores": True, "return_text": True, "truncate": True, "truncation_direction": "Left",
          "model": "served"}  # TEI's model field is keyrank's extension (several models served); the others require it
BASES = {
    V1RerankRequest: {"query": "q", "documents": ["d"], "model": "served"},
    CohereRerankRequest: {"query": "q", "documents": ["d"], "model": "served"},
    TeiRerankRequest: {"query": "q", "texts": ["d"]},
    InfinityRerankRequest: {"query": "q", "documents": ["d"], "model": "served"},
}


def _cases():
    for schema, base in BASES.items():
        for name, field in schema.model_fields.items():
            if name in base:
                continue
            for strategy in ("maxp", "keyb2"):
                yield pytest.param(schema, name, field.description or "", strategy, id=f"{schema.__name__}.{name}.{strategy}")


def _documented_as_ignored(description: str, strategy: str) -> bool:
    text = description.lower()
    if "accepted and ignored" in text:
        return True
    if "ignored when the strategy cuts no windows" in text:
        return not REGISTRY[strategy].windowed
    return False


@pytest.mark.parametrize(("schema", "name", "description", "strategy"), list(_cases()))
def test_every_vendor_fields_description_agrees_with_the_ignored_fields_header(schema, name, description, strategy):
    assert description, f"{schema.__name__}.{name} has no description on the OpenAPI page"
    body = schema.model_validate({**BASES[schema], name: VALUES[name]})
    named = name in ignored_fields(body, "served", strategy)
    assert named == _documented_as_ignored(description, strategy), (description, strategy)


def test_every_vendor_dialect_the_gateway_speaks_is_checked():
    """The dialects are read from the gateway (api/app.py's ``DIALECTS``), so one added there whose request is
    not checked above fails here until it joins BASES (and a field added to a checked one fails above, KeyError).
    native, keyrank's own shape, ignores no field: its every field acts."""
    from keyrank.api.app import DIALECTS

    vendors = {dialect.request for dialect in DIALECTS if dialect.request is not None and dialect.name != "native"}
    assert vendors == set(BASES), sorted(getattr(r, "__name__", str(r)) for r in vendors ^ set(BASES))


@pytest.mark.parametrize("schema", [V1RerankRequest, CohereRerankRequest, InfinityRerankRequest, TeiRerankRequest])
def test_another_models_name_is_named_and_the_served_one_is_not(schema):
    base = {**BASES[schema], "model": "served"}
    assert ignored_fields(schema.model_validate({**base, "model": "other"}), "served", "keyb2") == ["model"]
    assert ignored_fields(schema.model_validate(base), "served", "keyb2") == []


def test_infinitys_placeholder_model_names_no_model():
    body = InfinityRerankRequest.model_validate({"query": "q", "documents": ["d"]})
    assert body.model == INFINITY_DEFAULT_MODEL and ignored_fields(body, "served", "keyb2") == []


def test_tei_has_no_model_field_so_a_model_is_an_unknown_field():
    body = TeiRerankRequest.model_validate({"query": "q", "texts": ["d"], "model": "bge"})
    assert ignored_fields(body, "served", "keyb2") == ["model"]
