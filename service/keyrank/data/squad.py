"""Position sensitivity on SQuAD 2.0 (dev half), after SQuAD-PosQ.

Each answerable question ranks all contexts (paragraphs) of its article; its
own context is the one relevant candidate. Questions are bucketed by where
the answer sits in that context (``answer_start`` of the first answer, in
characters), so per-bucket scores and PSI = 1 - min/max show whether a
strategy favours evidence near the start of a document.

``build_far`` is a far-relevant construction from the same file, for training:
a question's own context inserted at a token offset into filler made of other
articles' contexts, among distractors carrying other contexts of the same
article; `keyrank finetune --task squad-far` trains on the articles
``squad_held_back`` leaves out.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

from keyrank.data import farrelevant as fr
from keyrank.data.queries import Candidate, EvalQuery, query_rng
from keyrank.tokenize import Encoded, TextTokenizer

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


def build_far(data_dir: Path, tokenizer: TextTokenizer, *, seed: int = 0, offsets: tuple[int, ...] = fr.OFFSETS,
              distractors: int = 4, tail_tokens: int = fr.TAIL_TOKENS, articles: set[str] | None = None) -> list[EvalQuery]:
    """One ranking per (context, offset): the context's first answerable question ranks its own context,
    inserted at ``offset`` tokens into off-topic filler (other articles' contexts, disjoint per document),
    among ``distractors`` documents built alike around other contexts of the same article (same topic,
    not the answer). ``articles``: titles to build from (None = all)."""
    data = json.loads((Path(data_dir) / "squad2-dev-half" / "dev-v2.0.json").read_text(encoding="utf-8"))
    encoded: dict[str, Encoded] = {}

    def enc(texts: list[str]) -> list[Encoded]:
        missing = [t for t in dict.fromkeys(texts) if t not in encoded]
        if missing:
            encoded.update(zip(missing, tokenizer.encode_documents(missing)))
        return [encoded[t] for t in texts]

    queries = []
    for article in data["data"]:
        if articles is not None and article["title"] not in articles:
            continue
        contexts = [p["context"] for p in article["paragraphs"]]
        others = enc([p["context"] for a in data["data"] if a["title"] != article["title"] for p in a["paragraphs"]])
        filler = fr.FillerStream([o for o in others if len(o)])
        for c, paragraph in enumerate(article["paragraphs"]):
            qa = next((q for q in paragraph["qas"] if not q.get("is_impossible") and q["answers"]), None)
            if qa is None or len(contexts) <= distractors:
                continue
            rng = query_rng(seed, qa["id"])
            negatives = rng.sample([i for i in range(len(contexts)) if i != c], distractors)
            inserts = enc([contexts[c]] + [contexts[i] for i in negatives])
            doc_tokens = max(offsets) + tail_tokens + max(len(i) for i in inserts)
            fillers = filler.draw_disjoint([doc_tokens - len(i) for i in inserts], rng)
            for offset in offsets:
                texts, spans = zip(*(fr.insert(pieces, passage, offset) for pieces, passage in zip(fillers, inserts)))
                fr.check_offsets(tokenizer, list(texts), list(spans), inserts, offset)
                docs = [Candidate("", t, (span,) if k == 0 else ()) for k, (t, span) in enumerate(zip(texts, spans))]
                queries.append(fr._ranking(f"{qa['id']}@{offset}", qa["question"], docs, seed, str(offset), {
                    "article": article["title"], "context": c, "negative_contexts": negatives, "offset_tokens": offset,
                    "relevant_tokens": len(inserts[0]),
                }, list(spans)))
    return queries
