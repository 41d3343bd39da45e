"""GET /playground: a page to look at a ranking, and the evidence that made it, in a browser.

One self-contained HTML file (``static/playground.html``: its CSS and JavaScript inline, nothing
fetched from elsewhere, so it works offline like /docs) and a bundled sample (``static/sample-meeting.json``:
a product team's planning meeting written for keyrank, ~5,000 words in four agenda parts, and one question
whose answer sits deep in part 2, past the first 512 tokens that firstp reads, with near misses in the
other parts; tests/test_playground.py holds it to showing that). The page calls
the native ``POST /rerank`` with ``return_evidence`` like any client would, and shows the ranking,
what each score rests on (coverage), each document with its evidence highlighted, and the per-stage
timings. Off with ``KEYRANK_PLAYGROUND=false`` (the routes are then not registered: 404).

Where the QMSum data is on this machine (the ``eval_data_dir`` setting, ``KEYRANK_EVAL_DATA_DIR``, as
``keyrank eval`` reads it), the page also offers one QMSum validation meeting (ES2009c, its four topic
segments as the documents, one of its human queries), read from there on each request and never copied
into the package: evaluation data stays where it is.

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

from keyrank.config import SELECTORS, STRATEGIES, Settings
from keyrank.strategies import REGISTRY

STATIC = Path(__file__).parent / "static"
PAGE = STATIC / "playground.html"
SAMPLE = STATIC / "sample-meeting.json"
QMSUM_MEETING = Path("qmsum") / "val" / "ES2009c.json"
QMSUM_QUERY = "What did the group talk about the touch screen under the limitation of the budget?"
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
        "qmsumUrl": f"{request.scope.get('root_path', '')}/playground/qmsum.json" if qmsum_path(settings).is_file() else None,
    }
    # json.dumps escapes nothing HTML-special on its own: "</" would end the script element.
    html = _page_template().replace(_CONFIG_SLOT, json.dumps(config).replace("</", "<\\/"), 1)
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


@router.get("/playground/sample.json")
async def sample() -> FileResponse:
    return FileResponse(SAMPLE, media_type="application/json")


def qmsum_path(settings: Settings) -> Path:
    """The QMSum meeting the page offers, under the eval_data_dir setting (looked for when asked: it may come and go)."""
    return settings.eval_data_dir / QMSUM_MEETING


def qmsum_sample(path: Path) -> dict:
    """The meeting's topic segments as documents ("Speaker: words" per turn) and QMSUM_QUERY, shaped like the
    bundled sample; ``relevant_document`` is the segment holding the query's judged turns."""
    meeting = json.loads(path.read_text(encoding="utf-8"))
    turns = meeting["meeting_transcripts"]
    spans = [[int(a), int(b)] for topic in meeting["topic_list"] for a, b in topic["relevant_text_span"][:1]]
    documents = [
        {"id": f"{path.stem} part {i}: {topic['topic']}",
         "text": "\n".join(f"{t['speaker']}: {t['content']}" for t in turns[a: b + 1])}
        for i, (topic, (a, b)) in enumerate(zip(meeting["topic_list"], spans), 1)
    ]
    query = next(q for q in meeting["specific_query_list"] if q["query"] == QMSUM_QUERY)
    first = int(query["relevant_text_span"][0][0])
    return {
        "about": f"One meeting of QMSum's validation split ({path.stem}, AMI corpus), its topic segments as the "
                 "documents and one of its human queries, read from the evaluation data on this machine.",
        "source": f"QMSum (Zhong et al., NAACL 2021), {path}",
        "license": "QMSum repository MIT; AMI Meeting Corpus CC BY 4.0",
        "query": query["query"],
        "relevant_document": next(i for i, (a, b) in enumerate(spans) if a <= first <= b),
        "documents": documents,
    }


@router.get("/playground/qmsum.json")
async def qmsum(request: Request) -> dict:
    path = qmsum_path(request.app.state.settings)
    if not path.is_file():
        raise HTTPException(404, f"no QMSum meeting at {path}: set KEYRANK_EVAL_DATA_DIR to the folder holding qmsum/")
    return qmsum_sample(path)
