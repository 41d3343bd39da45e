"""Real request shapes for the benchmarks, from the judged data (``--datasets``, KEYRANK_EVAL_DATA_DIR; never synthetic text).

- ``meeting_documents``: whole QMSum val transcripts (long, ~10k+ tokens each);
- ``candidate_documents``: QMSum transcripts cut into ~2k-token candidates, the
  issue's "100 candidates x 2k tokens" request;
- ``dl20_requests``: TREC DL20 BM25 top-100 passages (short: ~60-120 tokens);
- ``squad_requests``: SQuAD 2.0 contexts of one article per question (~150-300 tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

from keyrank.tokenize import TextTokenizer


def _meetings(datasets: Path, split: str = "val") -> list[dict]:
    paths = sorted((datasets / "qmsum" / split).glob("*.json"))
    if not paths:
        raise SystemExit(f"no QMSum meetings under {datasets / 'qmsum' / split}")
    return [json.loads(p.read_text()) for p in paths]


def _transcript(meeting: dict) -> str:
    return "\n".join(f"{t['speaker']}: {t['content']}" for t in meeting["meeting_transcripts"])


def meeting_documents(datasets: Path, count: int, max_chars: int) -> tuple[str, list[str]]:
    """Long real documents: QMSum val transcripts (one turn per line), cut to ``max_chars``."""
    docs, query = [], None
    for meeting in _meetings(datasets)[:count]:
        docs.append(_transcript(meeting)[:max_chars])
        if query is None and meeting.get("specific_query_list"):
            query = meeting["specific_query_list"][0]["query"]
    return query or "what did the group decide", docs


def candidate_documents(datasets: Path, tokenizer: TextTokenizer, count: int, tokens: int = 2000) -> tuple[list[str], list[str]]:
    """``count`` documents of ~``tokens`` tokens each (consecutive stretches of QMSum transcripts, val
    then train), and the QMSum queries of those meetings."""
    docs: list[str] = []
    queries: list[str] = []
    for split in ("val", "train"):
        if split == "train" and not (datasets / "qmsum" / split).is_dir():
            break  # a trimmed copy (the GPU machine's) holds val only
        for meeting in _meetings(datasets, split):
            (enc,) = tokenizer.encode_documents([_transcript(meeting)])
            queries += [q["query"] for q in meeting.get("specific_query_list", [])]
            for start in range(0, len(enc) - tokens + 1, tokens):
                a, b = enc.char_span(start, start + tokens)
                docs.append(enc.text[a:b])
                if len(docs) == count:
                    return docs, queries
    return docs, queries


def dl20_requests(datasets: Path, count: int) -> list[tuple[str, list[str]]]:
    """(query, its BM25 top-100 passages) for the first ``count`` DL20 queries: short documents."""
    data = json.loads((datasets / "trec-dl20-passage" / "bm25_dl20.json").read_text())
    return [(row["query"], [hit["content"] for hit in row["hits"]]) for row in data[:count]]


def squad_requests(datasets: Path, count: int) -> list[tuple[str, list[str]]]:
    """(question, every context of its article) for the first answerable question of ``count`` articles."""
    data = json.loads((datasets / "squad2-dev-half" / "dev-v2.0.json").read_text())["data"]
    out = []
    for article in data[:count]:
        contexts = [p["context"] for p in article["paragraphs"]]
        question = next(q["question"] for p in article["paragraphs"] for q in p["qas"] if not q.get("is_impossible"))
        out.append((question, contexts))
    return out
