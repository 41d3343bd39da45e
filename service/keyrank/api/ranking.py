"""The routes' one call into the pipeline: limits, admission, cancellation, blank documents, the count.

In request order:
1. limits (api/limits.py) -> 422 naming the setting;
2. admission (keyrank/admission.py): the cost estimated from characters -> 429 + Retry-After when
   the queued work is at its bound, before any tokenizing;
3. ``Reranker.arank`` as a task, raced against the ASGI receive channel: when the client
   disconnects the task is cancelled, which stops the pipeline at its next stage boundary and
   cancels its in-flight Triton calls (the scorer cancels them in its ``finally``); the request is
   counted as ``client_closed``, never as an outage;
4. empty and whitespace-only documents are not worth a score: they rank last (``BLANK_DOCUMENT_SCORE``);
5. one ``keyrank_requests_total`` count per request, whatever the outcome (api/errors.py for the failures).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, TypeVar

from fastapi import HTTPException, Request
from starlette.types import Receive

from keyrank import metrics
from keyrank.admission import AdmissionQueue, estimate_sequences
from keyrank.api.errors import record
from keyrank.api.limits import check_limits
from keyrank.config import Settings
from keyrank.errors import ClientClosed, InvalidRequest, Overloaded, ScoringUnavailable
from keyrank.strategies import get_spec

if TYPE_CHECKING:
    from keyrank.reranker import Ranking, RerankOptions

log = logging.getLogger("keyrank.api")
T = TypeVar("T")

BLANK_DOCUMENT_SCORE = -10_000.0
"""relevance_score of an empty or whitespace-only document: below any cross-encoder logit or sum of
them, so it ranks after every document with text (0.0 after the vendor routes' sigmoid)."""


async def rank(request: Request, query: str, texts: Sequence[str], options: RerankOptions) -> Ranking:
    """Rank for one HTTP request; raises what api/errors.py turns into answers and counts."""
    settings: Settings = request.app.state.settings
    spec = get_spec(options.strategy or settings.default_strategy)
    request.state.strategy = spec.name
    check_limits(query, texts, settings)
    selector = (options.selector or settings.default_selector) if spec.needs_selector else None
    template = request.app.state.reranker.template
    cost = estimate_sequences(spec.name, selector, query, texts, settings, frame_tokens=template.frame_tokens,
                              max_tokens_per_doc=options.max_tokens_per_doc, max_windows_per_doc=options.max_windows_per_doc)
    queue: AdmissionQueue = request.app.state.admission
    ticket = queue.admit(cost, options.timeout_s)
    completed = False
    try:
        with metrics.IN_FLIGHT.track_inprogress():
            # top_n is applied after blank documents are moved to the end.
            work = request.app.state.reranker.arank(query, list(texts), dataclasses.replace(options, top_n=None))
            ranking = await unless_disconnected(request.receive, work)
        completed = True
    except (InvalidRequest, ScoringUnavailable, Overloaded, ClientClosed):
        raise
    except Exception:
        log.exception("rerank failed, request_id=%s", request.state.request_id)
        raise HTTPException(500, "internal error") from None
    finally:
        queue.release(ticket, completed=completed)
    ranking = rank_blank_documents_last(ranking, texts, options.top_n)
    request.state.strategy = ranking.strategy
    record(request, "ok")
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


def rank_blank_documents_last(ranking: Ranking, texts: Sequence[str], top_n: int | None) -> Ranking:
    """Blank documents get ``BLANK_DOCUMENT_SCORE`` and no evidence, after all others, in request order."""
    blank = {i for i, text in enumerate(texts) if not text.strip()}
    results = list(ranking.results)
    if blank:
        kept = [r for r in results if r.index not in blank]
        demoted = sorted((r for r in results if r.index in blank), key=lambda r: r.index)
        results = kept + [dataclasses.replace(r, score=BLANK_DOCUMENT_SCORE, evidence=[], truncated=False) for r in demoted]
    return dataclasses.replace(ranking, results=results[:top_n] if top_n else results)
