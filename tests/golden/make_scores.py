"""Scores of one fixed request on every strategy and selector, as JSON on stdout.

Run against a code tree and a prepared model (``keyrank prepare --model ../shared/models/ce-minilm-l6``):

    PYTHONPATH=<tree>/service python tests/golden/make_scores.py <model dir> > tests/golden/scores.json

``scores.json`` was made this way on the commit before the request path was redesigned (08bba45);
tests/test_golden.py runs the same request on the current code and compares. On 2026-11-25 keyrank changed where
BM25's IDF comes from by default (``KEYRANK_BM25_IDF``); on this request the two cases that read BM25
(keyb2/bm25, keyb2/hybrid) kept every score and evidence span. The ``@request`` cases were added then:
the old per-request IDF, now an option, which must keep the numbers those cases had before it (they do,
to the last digit).
"""

from __future__ import annotations

import json
import sys

FILLER = (
    "The committee reviewed the minutes of the previous session and approved them without change. "
    "Several members asked about the schedule of the spring workshops, which moved to the east building. "
    "The treasurer noted that catering invoices arrive late and asked for a single contact person. "
)
QUERY = "what may the remote control cost to produce"
DOCUMENTS = [
    FILLER * 30 + "Marketing: we agreed that the remote control must not cost more than 12.50 euros to produce. " + FILLER * 5,
    "Whisk the eggs with the sugar, fold in the flour and bake for twenty minutes. " * 12,
    "Project manager: the remote control budget is tight; the case will be plastic and the battery a pair of AA cells. " + FILLER * 12,
    FILLER * 8,
]
CASES = [("firstp", None), ("maxp", None), ("sump", None), ("avgp", None), ("parade-max", None), ("parade-avg", None),
         ("keyb2", "bm25"), ("keyb2", "dense"), ("keyb2", "hybrid"), ("keyb2", "cross")]
IDF_CASES = [("keyb2", "bm25", "request"), ("keyb2", "hybrid", "request")]
"""(strategy, selector, bm25_idf): the per-request IDF option, which must keep the numbers of before 2026-11-25."""


def _case(ranking) -> dict:
    return {
        "scores": {str(r.index): round(r.score, 5) for r in ranking.results},
        "evidence": {str(r.index): [[e.start, e.end] for e in r.evidence] for r in ranking.results},
        "scored_tokens": ranking.usage.scored_tokens,
    }


def scores(model_dir: str) -> dict:
    from keyrank.reranker import Reranker

    out = {}
    with Reranker.local(model_dir) as reranker:
        for strategy, selector in CASES:
            out[strategy + (f"/{selector}" if selector else "")] = _case(reranker.rank(QUERY, DOCUMENTS, strategy=strategy, selector=selector))
    for strategy, selector, idf in IDF_CASES:
        with Reranker.local(model_dir, bm25_idf=idf) as reranker:
            out[f"{strategy}/{selector}@{idf}"] = _case(reranker.rank(QUERY, DOCUMENTS, strategy=strategy, selector=selector))
    return out


if __name__ == "__main__":
    json.dump(scores(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
    print()
