"""keyb2-blocks (or keyb2) with its blocks chosen by the judgements: how much is left to win by selection alone?

    PYTHONPATH=service python docs/experiments/oracle_blocks.py [--oracle] <keyrank eval arguments>

With ``--oracle`` the bm25 selector's block scores are lifted, by a constant larger than any BM25 score, for
every block that overlaps a judged evidence span of its document (QMSum's evidence turns for that query,
far-relevant's inserted passage); ``--min-share S`` lifts only blocks at least that share evidence. So
keyb2-blocks reads the evidence first (in BM25's order among the evidence blocks, then BM25's best of the rest),
and keyb2 chooses it first (and reads it first with ``KEYRANK_KEYB2_BLOCK_ORDER=score``). Everything after
selection (the lead rule, runs, the scorer, the fold) is the served one. Without ``--oracle`` the run is the
served default, for a paired comparison in the same command form.

It bounds what a better selector could give keyb2-blocks or keyb2 with this scorer and this reading; it reads the
judgements, so it is a diagnostic, never a setting.
"""

from __future__ import annotations

import sys

import numpy as np

from keyrank.evaluation import cli, tasks
from keyrank.select import bm25

LIFT = 1e6
"""Added to an evidence block's BM25 score: larger than any BM25 score."""

MIN_SHARE = 0.0
"""A block counts as evidence when at least this share of its characters is (``--min-share``; 0: any overlap)."""

EVIDENCE: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {}
"""(query text, document text) -> the document's judged evidence spans (characters) for that query, from the
tasks this run builds (a QMSum segment is a candidate of every query on its meeting, relevant to some)."""


def recording(build):
    """``tasks.build`` that also keeps every candidate's evidence spans by its text."""

    def wrapped(*args, **kwargs):
        queries = build(*args, **kwargs)
        for q in queries:
            for c in q.candidates:
                if c.evidence:
                    EVIDENCE[(q.query.strip(), c.text)] = tuple(c.evidence)
        return queries

    return wrapped


def evidence_blocks(query_text, doc, pieces) -> np.ndarray:
    """bool [blocks]: which of a document's blocks overlap one of its evidence spans for this query."""
    spans = EVIDENCE.get((query_text.strip(), doc.text), ())
    if not spans or len(pieces) == 0:
        return np.zeros(len(pieces), dtype=bool)
    first = doc.offsets[pieces.starts, 0]
    last = doc.offsets[pieces.ends - 1, 1]
    inside = np.zeros(len(pieces), dtype=np.int64)
    for a, z in spans:
        inside += np.clip(np.minimum(last, z) - np.maximum(first, a), 0, None)
    return inside >= np.maximum(MIN_SHARE * (last - first), 1)


def lifted(score):
    """``Bm25Selector.score`` with every evidence block lifted above the rest."""

    def wrapped(self, query_text, query, docs, pieces):
        scores = score(self, query_text, query, docs, pieces)
        return [s + LIFT * evidence_blocks(query_text, d, p) for s, d, p in zip(scores, docs, pieces)]

    return wrapped


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--oracle" in argv:
        argv.remove("--oracle")
        if "--min-share" in argv:
            i = argv.index("--min-share")
            MIN_SHARE = float(argv[i + 1])
            del argv[i : i + 2]
        tasks.build = recording(tasks.build)
        bm25.Bm25Selector.score = lifted(bm25.Bm25Selector.score)
    sys.exit(cli.main(argv))
