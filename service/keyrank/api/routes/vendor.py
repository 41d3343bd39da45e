"""What every vendor dialect (Jina, Cohere, TEI, Infinity) shares: the model a request names, the fields that
change nothing, and their scores.

Every field the vendors' APIs and SDKs send is accepted; those that change nothing here (``priority``,
``max_chunks_per_doc`` unless the strategy cuts windows, ``return_embeddings``, TEI's ``truncate``, a
``model`` other than the served one, fields unknown to us) are named in the ``X-Keyrank-Ignored-Fields``
header. With several models served (KEYRANK_MODELS) ``model`` picks one and a name not served is a 422
listing them (api/ranking.py's ``choose_model``). Scores are the sigmoid of keyrank's, in [0, 1] as these
clients expect, in the same order (TEI and Infinity: keyrank's own with ``raw_scores``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from keyrank.api.routes import IGNORED_HEADER, sigmoid, timing_header
from keyrank.schemas.common import VendorRequest
from keyrank.strategies import REGISTRY

if TYPE_CHECKING:
    from keyrank.reranker import RankedDocument, Ranking

_MAX_NAMED = 32
"""At most this many ignored fields are named in the header (it must stay a header)."""
_MAX_NAME_CHARS = 64
"""Each name is cut to this many header characters (percent-encoded), ending in "...": 32 names of
20k characters made a 640 KB header that httpx and curl refuse to read."""


def requested_model(body: VendorRequest) -> str | None:
    """The model a vendor request names; None for none or a client's placeholder (``unnamed_models``)."""
    named = getattr(body, "model", None)
    return None if named is None or named in type(body).unnamed_models else named


def vendor_score(ranked: RankedDocument, raw: bool) -> float:
    """keyrank's score with ``raw_scores``, else its sigmoid (as TEI and Infinity answer by default)."""
    return ranked.score if raw else sigmoid(ranked.score)


def ignored_fields(body: VendorRequest, model: str, strategy: str | None = None) -> list[str]:
    """Fields the caller sent that changed nothing: the dialect's vendor-only ones (``ignored_when_sent``),
    unknown ones, another model's name (not a client's placeholder, ``unnamed_models``), ``max_chunks_per_doc``
    when the strategy served cuts no windows (keyb2, firstp)."""
    ignored = set(type(body).ignored_when_sent)
    if strategy is not None and not REGISTRY[strategy].windowed:
        ignored.add("max_chunks_per_doc")
    names = sorted((body.model_fields_set & ignored) | set(body.model_extra or {}))
    named = getattr(body, "model", None) if "model" in type(body).model_fields else None  # else: an unknown field
    if named is not None and named != model and named not in type(body).unnamed_models:
        names.insert(0, "model")
    return names


def _header_name(name: str) -> str:
    """``name`` percent-encoded, cut to _MAX_NAME_CHARS at a character boundary, with "..." when cut."""
    encoded = quote(name[: _MAX_NAME_CHARS + 1], safe="_-.")
    if len(encoded) <= _MAX_NAME_CHARS:
        return encoded
    kept = ""
    for char in name:
        piece = quote(char, safe="_-.")
        if len(kept) + len(piece) > _MAX_NAME_CHARS - 3:
            break
        kept += piece
    return kept + "..."


def vendor_headers(ranking: Ranking, body: VendorRequest, model: str) -> dict[str, str]:
    """Server-Timing, and X-Keyrank-Ignored-Fields when the caller sent fields that changed nothing."""
    headers = timing_header(ranking)
    ignored = ignored_fields(body, model, ranking.strategy)
    if ignored:
        # Unknown field names are the caller's text: percent-encoded so they stay one header line.
        named = [_header_name(name) for name in ignored[:_MAX_NAMED]]
        more = [f"... ({len(ignored) - _MAX_NAMED} more)"] if len(ignored) > _MAX_NAMED else []
        headers[IGNORED_HEADER] = ", ".join(named + more)
    return headers
