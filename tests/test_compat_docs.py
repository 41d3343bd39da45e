"""The OpenAPI page tells the truth about the vendor routes' fields: a field whose description says it is
ignored is named in X-Keyrank-Ignored-Fields (``ignored_fields``, the header's one source), and a field
whose description says it acts is not."""

from __future__ import annotations

import pytest
from keyrank.api.routes.compat import ignored_fields
from keyrank.schemas.compat import CohereRerankRequest, V1RerankRequest

# A value each field accepts (the required query/documents/model are always sent).
VALUES = {"top_n": 1, "return_documents": True, "rank_fields": ["text"], "max_tokens_per_doc": 100,
          "max_chunks_per_doc": 2, "return_embeddings": True, "priority": 1}
BASE = {"query": "q", "documents": ["d"], "model": "served"}


def _cases():
    for schema in (V1RerankRequest, CohereRerankRequest):
        for name, field in schema.model_fields.items():
            if name in BASE:
                continue
            for strategy in ("maxp", "keyb2"):
                yield pytest.param(schema, name, field.description or "", strategy, id=f"{schema.__name__}.{name}.{strategy}")


def _documented_as_ignored(description: str, strategy: str) -> bool:
    text = description.lower()
    if "accepted and ignored" in text:
        return True
    if "ignored when the strategy cuts no windows" in text:
        return strategy in ("keyb2", "firstp")
    return False


@pytest.mark.parametrize(("schema", "name", "description", "strategy"), list(_cases()))
def test_every_vendor_fields_description_agrees_with_the_ignored_fields_header(schema, name, description, strategy):
    assert description, f"{schema.__name__}.{name} has no description on the OpenAPI page"
    body = schema.model_validate({**BASE, name: VALUES[name]})
    named = name in ignored_fields(body, "served", strategy)
    assert named == _documented_as_ignored(description, strategy), (description, strategy)


def test_another_models_name_is_named_and_the_served_one_is_not():
    assert ignored_fields(V1RerankRequest.model_validate({**BASE, "model": "other"}), "served", "keyb2") == ["model"]
    assert ignored_fields(V1RerankRequest.model_validate(BASE), "served", "keyb2") == []
