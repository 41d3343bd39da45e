"""What every evaluation task produces: judged queries with their candidates.

A task (QMSum, far-relevant DL20, SQuAD) turns a public data set into a list
of ``EvalQuery``; the runner ranks each query's candidates through the real
``Reranker`` and the report scores the rankings against ``qrels``. Keeping the
constructions to this one shape lets every strategy be measured identically.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Candidate:
    """One document the reranker must place."""

    doc_id: str
    """Identifier inside its query (ids repeat across queries)."""
    text: str
    """The document text exactly as sent to the reranker."""
    evidence: tuple[tuple[int, int], ...] = ()
    """Character [start, end) spans of the judged evidence inside ``text``; empty for non-relevant documents."""


@dataclass(frozen=True, slots=True)
class EvalQuery:
    """A query, its candidate documents and their judgements."""

    qid: str
    """Unique within a task."""
    query: str
    """The query text."""
    candidates: list[Candidate]
    """Documents to rank, in the order they are sent (shuffled by the construction)."""
    qrels: dict[str, int]
    """Relevance grade per ``doc_id``; missing = 0. At least one grade > 0."""
    bucket: str
    """Position bucket of the evidence (token offset, answer_start range): the unit of PSI."""
    meta: dict = field(default_factory=dict)
    """Construction details (source ids, offsets) kept in the run JSON."""


def query_rng(seed: int, key: str) -> random.Random:
    """A generator per (seed, query): a query's construction does not change when others are subsampled away."""
    return random.Random((seed << 32) ^ zlib.crc32(key.encode("utf-8")))


def subsample(queries: Sequence[EvalQuery], max_queries: int | None, seed: int) -> list[EvalQuery]:
    """At most ``max_queries``, spread evenly over the position buckets, in a seed-determined draw.

    Stratified, so a small CPU run still reports every bucket (and a PSI)."""
    queries = list(queries)
    if max_queries is None or len(queries) <= max_queries:
        return queries
    by_bucket: dict[str, list[EvalQuery]] = {}
    for q in queries:
        by_bucket.setdefault(q.bucket, []).append(q)
    rng = random.Random(seed)
    for members in by_bucket.values():
        rng.shuffle(members)
    picked: list[EvalQuery] = []
    # Round-robin over buckets so each gets an equal share while it lasts.
    while len(picked) < max_queries:
        progressed = False
        for bucket in sorted(by_bucket):
            if by_bucket[bucket] and len(picked) < max_queries:
                picked.append(by_bucket[bucket].pop())
                progressed = True
        if not progressed:
            break
    order = {q.qid: i for i, q in enumerate(queries)}
    return sorted(picked, key=lambda q: order[q.qid])
