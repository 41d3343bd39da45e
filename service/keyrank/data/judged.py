"""Judged training data: what a search engineer has, as query groups.

A ``JudgedQuery`` is one query with its candidate documents and their grades:
the unit the pipeline plans (one request: BM25's IDF is computed over the
candidate set, as in serving) and the unit losses compare documents within.

Readers:
- TREC: a qrels file (``qid 0 docid grade``), a JSONL of ``{"id", "text"}``
  documents, a TSV (``qid<TAB>query``) or JSONL (``{"id", "text"}``) of queries,
  and optionally a TREC run (``qid Q0 docid rank score tag``) whose top
  ``depth`` documents join each query's judged ones as candidates (unjudged = 0).
- The task builders beside this module (``qmsum``, ``farrelevant``, ``squad``): ``EvalQuery`` lists.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyrank.data.queries import Candidate, EvalQuery


@dataclass(frozen=True, slots=True)
class JudgedQuery:
    """One query, its candidates and their grades."""

    qid: str
    """Unique across the training set (sources are prefixed: ``qmsum:``, ``farrel:``, ``trec:``)."""
    query: str
    """The query text."""
    doc_ids: tuple[str, ...]
    """Candidate ids, in the order they are planned."""
    texts: tuple[str, ...]
    """Candidate texts, aligned with ``doc_ids``."""
    grades: tuple[int, ...]
    """Relevance grade of each candidate (0 = not relevant or unjudged)."""
    group: str
    """What must not be split between train and dev (a meeting, a DL20 topic, a query)."""

    @property
    def positives(self) -> list[int]:
        """Candidate indices with a grade above 0."""
        return [i for i, g in enumerate(self.grades) if g > 0]

    @property
    def negatives(self) -> list[int]:
        """Candidate indices with grade 0."""
        return [i for i, g in enumerate(self.grades) if g <= 0]

    @property
    def trainable(self) -> bool:
        """At least one relevant and one non-relevant candidate: something to rank."""
        return bool(self.positives) and bool(self.negatives)

    def as_eval_query(self) -> EvalQuery:
        """The same query in the evaluation's shape (for the dev metric)."""
        return EvalQuery(
            qid=self.qid, query=self.query, candidates=[Candidate(d, t) for d, t in zip(self.doc_ids, self.texts)],
            qrels={d: g for d, g in zip(self.doc_ids, self.grades) if g > 0}, bucket="all",
        )


@dataclass(frozen=True, slots=True)
class TrecFiles:
    """Judged data as a search engineer has it."""

    qrels: Path
    """TREC qrels (``qid 0 docid grade``)."""
    docs: Path
    """JSONL of ``{"id", "text"}`` documents."""
    queries: Path
    """TSV ``qid<TAB>text`` or JSONL ``{"id", "text"}`` queries."""
    run: Path | None = None
    """Optional TREC run: its top ``depth`` documents join the judged ones as candidates."""
    depth: int = 100
    """Run depth read."""
    relevant_from: int = 1
    """Lowest grade that counts as relevant (TREC DL: 2)."""


def add_trec_arguments(parser: Any, *, required: bool = False, lead: str = "") -> None:
    """``--qrels --docs --queries --run --depth --relevant-from`` on ``parser`` (or an argument group):
    one wording for ``keyrank finetune``, ``eval --task trec`` and ``tune``; ``lead`` starts each help."""
    parser.add_argument("--qrels", type=Path, required=required, default=None, help=f"{lead}TREC qrels, 'qid 0 docid grade' lines")
    parser.add_argument("--docs", type=Path, required=required, default=None,
                        help=f'{lead}JSONL documents {{"id", "text"}} (title prepended when present)')
    parser.add_argument("--queries", type=Path, required=required, default=None,
                        help=f"{lead}queries: TSV 'qid<TAB>text' or JSONL {{\"id\", \"text\"}}")
    parser.add_argument("--run", type=Path, default=None, help=f"{lead}a first-stage TREC run: its top --depth documents join each query's judged ones")
    parser.add_argument("--depth", type=int, default=100, help=f"{lead}candidates taken from --run per query")
    parser.add_argument("--relevant-from", type=int, default=1, help=f"{lead}the lowest grade that counts as relevant (TREC DL: 2)")


def trec_files(args: Any, command: str) -> TrecFiles | None:
    """The ``TrecFiles`` named by ``add_trec_arguments``' options; None when none of the three files is
    given; ``SystemExit`` naming ``command`` when only some are."""
    given = (args.qrels, args.docs, args.queries)
    if not any(given):
        return None
    if not all(given):
        raise SystemExit(f"{command} reads your TREC files: give --qrels, --docs and --queries together")
    return TrecFiles(args.qrels, args.docs, args.queries, args.run, args.depth, args.relevant_from)


def from_eval(queries: Iterable[EvalQuery], source: str, group_of=None) -> list[JudgedQuery]:
    """Evaluation queries as judged queries; ``group_of(query)`` names its train/dev unit (default: the qid)."""
    out = []
    for q in queries:
        ids = tuple(c.doc_id for c in q.candidates)
        out.append(JudgedQuery(
            qid=f"{source}:{q.qid}", query=q.query, doc_ids=ids, texts=tuple(c.text for c in q.candidates),
            grades=tuple(int(q.qrels.get(d, 0)) for d in ids), group=f"{source}:{group_of(q) if group_of else q.qid}",
        ))
    return out


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """TREC qrels: ``qid iteration docid grade`` per line."""
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 4:
            raise ValueError(f"{path}:{n}: a qrels line is 'qid 0 docid grade', got {line!r}")
        qrels[parts[0]][parts[2]] = int(parts[3])
    return dict(qrels)


def read_run(path: Path, depth: int) -> dict[str, list[str]]:
    """A TREC run's top ``depth`` document ids per query, by rank."""
    ranked: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 4:
            ranked[parts[0]].append((int(parts[3]), parts[2]))
    return {qid: [d for _, d in sorted(rows)[:depth]] for qid, rows in ranked.items()}


def read_documents(path: Path, wanted: set[str] | None = None) -> dict[str, str]:
    """JSONL ``{"id": ..., "text": ...}`` (``title`` is prepended when present); only ``wanted`` ids if given."""
    docs = {}
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            doc_id = str(row.get("id", row.get("_id", row.get("docid"))))
            if doc_id == "None" or ("text" not in row and "contents" not in row):
                raise ValueError(f"{path}:{n}: a document line needs 'id' and 'text'")
            if wanted is None or doc_id in wanted:
                text = row.get("text", row.get("contents"))
                docs[doc_id] = f"{row['title']}\n{text}" if row.get("title") else text
    return docs


def read_queries(path: Path) -> dict[str, str]:
    """Queries as TSV (``qid<TAB>text``) or JSONL (``{"id", "text"}``), told apart by the first character."""
    text = Path(path).read_text(encoding="utf-8")
    queries = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            row = json.loads(line)
            queries[str(row.get("id", row.get("_id", row.get("qid"))))] = row.get("text", row.get("query"))
        else:
            qid, sep, query = line.partition("\t")
            if not sep:
                raise ValueError(f"{path}:{n}: a TSV query line is 'qid<TAB>text'")
            queries[qid] = query
    return queries


def from_trec(qrels_path: Path, docs_path: Path, queries_path: Path, *, run_path: Path | None = None,
              depth: int = 100, qids: Sequence[str] | None = None, relevant_from: int = 1) -> list[JudgedQuery]:
    """Judged queries from TREC files: candidates = judged documents (+ a run's top ``depth``), in id order.

    Grades below ``relevant_from`` count as 0 (TREC DL: 2, its grade 1 is only "related")."""
    qrels = read_qrels(qrels_path)
    run = read_run(run_path, depth) if run_path else {}
    queries = read_queries(queries_path)
    keep = [q for q in (qids or sorted(qrels)) if q in queries]
    wanted = {d for q in keep for d in list(qrels.get(q, {})) + run.get(q, [])}
    docs = read_documents(docs_path, wanted)
    out = []
    for qid in keep:
        judged = qrels.get(qid, {})
        ids = [d for d in dict.fromkeys(sorted(judged) + run.get(qid, [])) if d in docs]
        out.append(JudgedQuery(
            qid=f"trec:{qid}", query=queries[qid], doc_ids=tuple(ids), texts=tuple(docs[d] for d in ids),
            grades=tuple(g if (g := judged.get(d, 0)) >= relevant_from else 0 for d in ids), group=f"trec:{qid}",
        ))
    return out
