"""The routes' one call into the pipeline: limits, admission, cancellation, blank documents, the count.

In request order:
0. the model: the request's ``model`` names one of the served models (``choose_model``; absent = the
   default, an unknown name -> 422 listing the served names); its pipeline resolves the options once
   (keyrank/resolved.py: defaults, names, caps), and everything below reads that ``Resolved``;
1. limits (api/limits.py) -> 422 naming the setting;
2. admission (keyrank/admission.py): the resolved request's cost estimated from characters -> 429 +
   Retry-After when the queued work is at its bound, before any tokenizing;
3. ``Reranker.arank`` as a task, raced against the ASGI receive channel: when the client
   disconnects the task is cancelled, which stops the pipeline at its next stage boundary and
   cancels its in-flight Triton calls (the scorer cancels them in its ``finally``); the request is
   counted as ``client_closed``, never as an outage;
4. blank documents (nothing to read: empty, whitespace, zero-width, control, format, tag or private-use
   characters, combining marks alone; keyrank/blank.py) are not worth a score: admission does not charge them,
   ``arank`` never sends them to the pipeline and ranks them last (``BLANK_DOCUMENT_SCORE``), then cuts ``top_n``;
5. one ``keyrank_requests_total`` count per request, whatever the outcome, labelled with the model
   (api/errors.py for the failures).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, TypeVar

from fastapi import HTTPException, Request
from starlette.types import Receive

from keyrank import metrics
from keyrank.admission import AdmissionQueue, estimate_sequences
from keyrank.api.errors import record
from keyrank.api.limits import check_limits
from keyrank.api.routes import model_ids
from keyrank.blank import is_blank
from keyrank.config import Settings
from keyrank.errors import ClientClosed, InvalidRequest, Overloaded, ScoringUnavailable
from keyrank.reranker import Ranking, Reranker
from keyrank.scoring.fairness import costing
from keyrank.strategies import STRATEGIES

if TYPE_CHECKING:
    from keyrank.resolved import RerankOptions, Resolved

log = logging.getLogger("keyrank.api")
T = TypeVar("T")


async def rank(request: Request, query: str, texts: Sequence[str], options: RerankOptions, model: str | None = None) -> Ranking:
    """Rank for one HTTP request with the model it names (``choose_model``); raises what api/errors.py turns
    into answers and counts."""
    settings: Settings = request.app.state.settings
    # The count's strategy label, also for a request refused before resolution (an unknown model): the name
    # asked for when the registry knows it (the wire types only let those through), else the default.
    asked = options.strategy or settings.default_strategy
    request.state.strategy = asked if asked in STRATEGIES else "-"
    reranker = choose_model(request, model)
    resolved = reranker.pipeline.resolve(options)
    check_limits(query, texts, settings)
    # Blank documents are never tokenized or scored (``arank`` ranks them last): 1,000 of them cost what none do,
    # and a request of nothing else is answered without admission.
    readable = [text for text in texts if not is_blank(text)]
    if readable:
        ranking = await _rank_readable(request, reranker, query, texts, readable, resolved)
    else:
        ranking = await reranker.arank(query, texts, resolved)
    request.state.strategy = ranking.strategy
    record(request, "ok")
    return ranking


def choose_model(request: Request, name: str | None) -> Reranker:
    """The reranker of the model ``name`` (absent = the default), noted for the request's metrics.

    With several models served (KEYRANK_MODELS) an unknown name is a 422 listing the served ones. With one,
    every route ranks with it whatever ``model`` says, as the vendor routes always did, and names the field
    in X-Keyrank-Ignored-Fields when it names another model."""
    rerankers: dict[str, Reranker] | None = request.app.state.rerankers
    served = model_ids(request)
    if name is not None and name not in served and rerankers:
        raise InvalidRequest(f"model: unknown model {name!r}; served models: {', '.join(served)}", field="model")
    chosen = served[0] if name is None or name not in served else name
    request.state.model = chosen
    return rerankers[chosen] if rerankers else request.app.state.reranker


async def _rank_readable(request: Request, reranker: Reranker, query: str, texts: Sequence[str], readable: list[str],
                         resolved: Resolved) -> Ranking:
    """Admission of what ``readable`` costs, then the pipeline over all ``texts`` raced against the client's disconnect."""
    cost = estimate_sequences(resolved, query, readable)
    queue: AdmissionQueue = request.app.state.admission
    ticket = queue.admit(cost, resolved.timeout_s)
    completed = False
    try:
        with metrics.IN_FLIGHT.track_inprogress(), costing(cost):  # the cost orders its batches (scoring/fairness.py)
            work = reranker.arank(query, texts, resolved)
            ranking = await unless_disconnected(request.receive, work)
        completed = True
    except (InvalidRequest, ScoringUnavailable, Overloaded, ClientClosed):
        raise
    except Exception:
        log.exception("rerank failed, request_id=%s", request.state.request_id)
        raise HTTPException(500, "internal error") from None
    finally:
        queue.release(ticket, completed=completed)
    return ranking


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """``work``'s result, or ``ClientClosed`` (with ``work`` cancelled) once the client disconnects.

    Called after the body was read: the next ASGI message on ``receive`` can only be
    ``http.disconnect``, which uvicorn sends when the connection closes.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task  # its finally blocks (the Triton calls' cancellation) run before we answer
    if task.cancelled():
        raise ClientClosed("client closed the request")
    return task.result()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
