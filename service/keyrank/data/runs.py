"""What a system answered per judged query, and how good that ranking is.

``QueryRun`` is one system's answer to one ``EvalQuery`` (its scores, usage,
timings and evidence: a row of ``keyrank eval``'s run files); ``per_query``
measures rankings against the queries' grades with ``ir-measures`` (the
pytrec_eval implementations TREC uses), never by hand. The evaluation's report
and the training loop's dev metric both score through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from keyrank.data.queries import EvalQuery

MEASURES = ("nDCG@10", "RR@10", "R@5")
"""Default measures: NDCG@10 and MRR@10 as in the papers, recall at a cut below the candidate count."""


@dataclass(slots=True)
class QueryRun:
    """What one system did on one query."""

    qid: str
    """The query."""
    system: str
    """The evaluation's ``System.name`` (the training loop: its strategy)."""
    scores: dict[str, float] = field(default_factory=dict)
    """Score per candidate ``doc_id`` (every candidate, not only the top)."""
    evidence: dict[str, list[tuple[int, int, int | None]]] = field(default_factory=dict)
    """(start, end, block) evidence spans the reranker returned, per ``doc_id``."""
    scored_sequences: int = 0
    """Sequences sent to the cross-encoder (selector included)."""
    scored_tokens: int = 0
    """Tokens sent to the cross-encoder, padding excluded."""
    document_tokens: int = 0
    """Tokens in all candidates of the request."""
    truncated_documents: int = 0
    """Candidates the strategy did not read to the end (window cap, max_tokens_per_doc)."""
    timings_ms: dict[str, float] = field(default_factory=dict)
    """Per-stage times the reranker reported (tokenize, segment, select, infer, aggregate, total)."""
    wall_ms: float = 0.0
    """Time around the ``arank`` call, as a client sees it."""
    error: str | None = None
    """Set when the reranker raised; the query then scores 0."""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> QueryRun:
        run = cls(**data)
        run.evidence = {d: [tuple(span) for span in spans] for d, spans in run.evidence.items()}
        return run


def per_query(queries: Sequence[EvalQuery], runs: Sequence[QueryRun],
              measures: Sequence[str] = MEASURES) -> dict[str, dict[str, float]]:
    """{qid: {measure: value}}; a query the system failed on (no scores) counts 0."""
    import ir_measures  # the eval extra: QueryRun alone needs no more than the standard library

    parsed = [ir_measures.parse_measure(m) for m in measures]
    qrels = {q.qid: dict(q.qrels) for q in queries}
    run = {r.qid: dict(r.scores) for r in runs if r.scores}
    values = {q.qid: {m: 0.0 for m in measures} for q in queries}
    names = {str(p): m for p, m in zip(parsed, measures)}
    for metric in ir_measures.iter_calc(parsed, qrels, run):
        values[metric.query_id][names[str(metric.measure)]] = float(metric.value)
    return values
