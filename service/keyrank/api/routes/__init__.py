"""The routes, one module per client dialect, thin: parse (schemas/), call (api/ranking.py), shape the answer.
Each module holds its dialect's record (``DIALECT``, api/dialect.py), which api/app.py mounts.

- native.py: POST /rerank, keyrank's own shape;
- jina.py: POST /v1/rerank (Jina, Cohere v1); cohere.py: POST /v2/rerank (Cohere v2);
- tei.py: /tei/rerank, /tei/info; infinity.py: /infinity/rerank, /infinity/models;
- openai.py: GET /v1/models;
- vendor.py: the rules every vendor dialect shares (the ignored-fields header, the model named).

What every answer shares lives here.
"""

from __future__ import annotations

import math
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from fastapi import Request

if TYPE_CHECKING:
    from keyrank.reranker import RankedDocument, Ranking

IGNORED_HEADER = "X-Keyrank-Ignored-Fields"
"""Names the request's fields that changed nothing (routes/vendor.py's ``ignored_fields``; on POST /rerank, another model's name)."""


def served_model(request: Request, ranking: Ranking) -> str:
    """The model that ranked, by name: with KEYRANK_MODELS its name there; else KEYRANK_MODEL_NAME, else the
    prepared model's hub id or folder name: never a server path."""
    if request.app.state.rerankers:
        return ranking.model
    return _public(request.app.state.settings.model_name or ranking.model)


def model_id(request: Request) -> str:
    """The default model's name as answers report it (``served_model``), before any ranking."""
    return model_ids(request)[0]


def model_ids(request: Request) -> list[str]:
    """Every served model's name, the default first (one, unless KEYRANK_MODELS names several)."""
    return served_names(request.app)


def served_names(app: Any) -> list[str]:
    """``model_ids`` of an app: [] before its one reranker is built (the lifespan builds it)."""
    if app.state.rerankers:
        return list(app.state.rerankers)
    if app.state.reranker is None:
        return []
    return [_public(app.state.settings.model_name or app.state.reranker.model_name)]


def prepared_at(request: Request, name: str) -> int:
    """Unix time the served model ``name`` was prepared: its manifest's modification time (0 if it has none)."""
    rerankers = request.app.state.rerankers
    reranker = rerankers[name] if rerankers else request.app.state.reranker
    manifest = reranker.settings.gateway_dir / "manifest.json"
    try:
        return int(manifest.stat().st_mtime)
    except OSError:
        return 0


def _public(name: str) -> str:
    return PurePath(name).name if name.startswith(("/", ".", "~", "\\")) else name


def timing_header(ranking: Ranking) -> dict[str, str]:
    """The per-stage wall times as a ``Server-Timing`` header."""
    return {"Server-Timing": ", ".join(f"{stage};dur={ms:.3f}" for stage, ms in ranking.timings_ms.items())}


def sigmoid(score: float) -> float:
    """Maps the logit into [0, 1] as Jina and Cohere clients expect; the order is unchanged."""
    return 0.5 * (1.0 + math.tanh(0.5 * score))


def coverage(ranked: RankedDocument) -> dict[str, Any]:
    """The vendor results' opt-in extension (``return_evidence``): evidence spans and how much was read."""
    return {
        "evidence": [{"start": e.start, "end": e.end} for e in ranked.evidence],
        "truncated": ranked.truncated,
        "read_tokens": ranked.read_tokens,
        "document_tokens": ranked.document_tokens,
    }
