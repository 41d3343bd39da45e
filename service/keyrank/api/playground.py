"""GET /playground: a page to look at a ranking, and the evidence that made it, in a browser.

One self-contained HTML file (``static/playground.html``: its CSS and JavaScript inline, nothing
fetched from elsewhere, so it works offline like /docs) and a bundled sample (``static/sample-meeting.json``:
a product team's planning meeting written for keyrank, ~5,000 words in four agenda parts, and one question
whose answer sits deep in part 2, past the first 512 tokens that firstp reads, with near misses in the
other parts; tests/test_playground.py holds it to showing that). The page calls
the native ``POST /rerank`` with ``return_evidence`` like any client would, and shows the ranking,
what each score rests on (coverage), each document with its evidence highlighted, and the per-stage
timings. Off with ``KEYRANK_PLAYGROUND=false`` (the routes are then not registered: 404).

With ``KEYRANK_API_KEY`` set the page and its sample need the key too: ``Authorization: Bearer <key>``,
or Basic credentials with the key as the password, which is what a browser sends after the
``WWW-Authenticate: Basic`` challenge of the 401 (any user name). The page's own calls to /rerank
send the key typed into its key field as a Bearer token.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from functools import cache
from pathlib import Path, PurePath

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse

from keyrank.config import SELECTORS, STRATEGIES
from keyrank.strategies import REGISTRY

STATIC = Path(__file__).parent / "static"
PAGE = STATIC / "playground.html"
SAMPLE = STATIC / "sample-meeting.json"
_CONFIG_SLOT = "/*PLAYGROUND_CONFIG*/null"
"""Where the page's configuration (choices and defaults) is written into the HTML."""


_CHALLENGE = {"WWW-Authenticate": 'Basic realm="keyrank playground", charset="UTF-8"'}
"""Makes a browser ask for the key (as the password) instead of showing the 401."""


def _given_key(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer":
        return token
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(token, validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return ""
    return ""


def require_key(request: Request) -> None:
    """Nothing without a key configured; else the key as a Bearer token or as Basic's password."""
    key = request.app.state.settings.api_key
    if key is None:
        return
    given = _given_key(request)
    if not given:
        raise HTTPException(401, "missing API key: the playground needs KEYRANK_API_KEY (as the password, any user name)",
                            headers=_CHALLENGE)
    if not secrets.compare_digest(given.encode(), key.get_secret_value().encode()):
        raise HTTPException(401, "invalid API key", headers=_CHALLENGE)


router = APIRouter(include_in_schema=False, dependencies=[Depends(require_key)])


def install(app: FastAPI) -> None:
    """The page and its sample, when the setting is on."""
    if app.state.settings.playground:
        app.include_router(router)


def _model_names(request: Request) -> list[str]:
    """The served models as answers name them, the default first: KEYRANK_MODELS' names, else one:
    KEYRANK_MODEL_NAME, else the prepared folder's name or hub id."""
    if request.app.state.rerankers:
        return list(request.app.state.rerankers)
    settings = request.app.state.settings
    reranker = request.app.state.reranker
    name = settings.model_name or (reranker.model_name if reranker is not None else "") or ""
    return [m for m in [PurePath(name).name if name.startswith(("/", ".", "~", "\\")) else name] if m]


@cache
def _page_template() -> str:
    return PAGE.read_text(encoding="utf-8")


@router.get("/playground")
async def playground(request: Request) -> HTMLResponse:
    settings = request.app.state.settings
    config = {
        "strategies": list(STRATEGIES),
        "selectorStrategies": [name for name, spec in REGISTRY.items() if spec.needs_selector],
        "selectors": list(SELECTORS),
        "defaults": {"strategy": settings.default_strategy, "selector": settings.default_selector},
        "models": _model_names(request),
        "keyRequired": settings.api_key is not None,
        "rerankUrl": f"{request.scope.get('root_path', '')}/rerank",
        "sampleUrl": f"{request.scope.get('root_path', '')}/playground/sample.json",
    }
    # json.dumps escapes nothing HTML-special on its own: "</" would end the script element.
    html = _page_template().replace(_CONFIG_SLOT, json.dumps(config).replace("</", "<\\/"), 1)
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


@router.get("/playground/sample.json")
async def sample() -> FileResponse:
    return FileResponse(SAMPLE, media_type="application/json")
