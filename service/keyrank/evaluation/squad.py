"""Position sensitivity on SQuAD 2.0 (dev half), after SQuAD-PosQ.

Each answerable question ranks all contexts (paragraphs) of its article; its
own context is the one relevant candidate. Questions are bucketed by where
the answer sits in that context (``answer_start`` of the first answer, in
characters), so per-bucket scores and PSI = 1 - min/max show whether a
strategy favours evidence near the start of a document.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

from keyrank.evaluation.queries import Candidate, EvalQuery, query_rng

BUCKET_EDGES = (0, 100, 200, 300, 400, 500)
"""answer_start bucket edges in characters; the last bucket is open (500+)."""


def answer_bucket(answer_start: int, edges: tuple[int, ...] = BUCKET_EDGES) -> str:
    """'0-100', ..., '400-500', '500+'."""
    for lo, hi in pairwise(edges):
        if lo <= answer_start < hi:
            return f"{lo}-{hi}"
    return f"{edges[-1]}+"


def build(data_dir: Path, *, seed: int = 0) -> list[EvalQuery]:
    """One query per answerable question, in file order."""
    data = json.loads((Path(data_dir) / "squad2-dev-half" / "dev-v2.0.json").read_text(encoding="utf-8"))
    queries = []
    for a, article in enumerate(data["data"]):
        contexts = [p["context"] for p in article["paragraphs"]]
        for c, paragraph in enumerate(article["paragraphs"]):
            for qa in paragraph["qas"]:
                if qa.get("is_impossible") or not qa["answers"]:
                    continue
                answer = qa["answers"][0]
                start = int(answer["answer_start"])
                span = (start, start + len(answer["text"]))
                candidates = [
                    Candidate(f"a{a:02d}c{i:03d}", text, (span,) if i == c else ())
                    for i, text in enumerate(contexts)
                ]
                query_rng(seed, qa["id"]).shuffle(candidates)
                queries.append(EvalQuery(
                    qid=qa["id"], query=qa["question"], candidates=candidates,
                    qrels={f"a{a:02d}c{c:03d}": 1}, bucket=answer_bucket(start),
                    meta={"article": article["title"], "answer_start": start, "context_chars": len(contexts[c])},
                ))
    return queries
