"""Far-relevant diagnostic on TREC DL20, after MS MARCO FarRelevant (Boytsov et al.).

For each DL20 query with a relevant passage (grade >= 2) among its BM25
top-100, one relevant passage and ``distractors`` of the query's judged
non-relevant passages are drawn (seeded): the *inserts*. Every candidate is a
long filler document with one insert starting exactly at a cross-encoder
token offset; for every offset the query is one ranking of the target
(relevant insert) among the distractors (non-relevant inserts), all of the
same length. Each document's filler is the same at every offset, so offsets
differ in nothing but where the inserts sit.

Filler (``filler=``):
- ``other-topics`` (default): judged non-relevant passages of the *other*
  DL20 queries, drawn without replacement, so no two candidates share filler
  and the query-topical text of every document is its insert.
- ``same-topic``: the query's own other non-relevant BM25 hits (judged grade
  0, then unjudged). The pool holds ~50 passages, so every candidate contains
  nearly the same ones: the best-scoring non-relevant filler passage sits in
  every document and decides windowed and block-selecting strategies alike
  (see docs/EVALUATION.md). Kept as the hard variant.

The ceiling (``build_bare``) ranks the same inserts bare: the same relevant
passage among the same non-relevant passages, as short documents. The gap
between the two at an offset is what length and position cost a strategy.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from keyrank.data.queries import Candidate, EvalQuery, query_rng
from keyrank.tokenize import Encoded, TextTokenizer

OFFSETS = (0, 512, 1024, 2048, 3072)
"""Token offsets at which the relevant passage starts (cross-encoder word pieces, no specials)."""
TAIL_TOKENS = 256
"""Filler after the largest offset, so even the last insertion is not at the document's end."""
DISTRACTORS = 9
"""Documents with a non-relevant insert per ranking: one relevant among ten."""
FILLERS = ("other-topics", "same-topic")
"""Where filler text comes from (module doc)."""
NO_FILLER = {
    "same-topic": "no non-relevant passages to build same-topic filler from: every non-relevant hit of the topic is (or holds) one of its distractors",
    "other-topics": "no non-relevant passages to build other-topics filler from: no other topic's judged non-relevant passage is left (none, or all among this topic's hits)",
}
"""Why a topic is skipped (``build``'s ``skipped``): its filler pool is empty."""


@dataclass(frozen=True, slots=True)
class TopicPool:
    """One DL20 query's material."""

    qid: str
    """DL20 query id."""
    query: str
    """The query text."""
    relevant: list[tuple[str, str]]
    """(docid, text) of hits with grade >= 2, BM25 order."""
    judged: list[tuple[str, str]]
    """(docid, text) of hits judged grade 0."""
    unjudged: list[tuple[str, str]]
    """(docid, text) of hits without a judgement."""


def load_topics(data_dir: Path) -> list[TopicPool]:
    """DL20 BM25 top-100 with texts, split by NIST grade."""
    root = Path(data_dir) / "trec-dl20-passage"
    grades: dict[str, dict[str, int]] = defaultdict(dict)
    for line in (root / "qrels.dl20-passage.txt").read_text().splitlines():
        if line.strip():
            qid, _, docid, grade = line.split()
            grades[qid][docid] = int(grade)
    topics = []
    for entry in json.loads((root / "bm25_dl20.json").read_text(encoding="utf-8")):
        qid = str(entry["hits"][0]["qid"])
        judged = grades[qid]
        hits = [(str(h["docid"]), h["content"]) for h in sorted(entry["hits"], key=lambda h: h["rank"])]
        related_texts = {text for docid, text in hits if judged.get(docid, 0) >= 1}
        topics.append(TopicPool(
            qid=qid, query=entry["query"],
            relevant=[(d, t) for d, t in hits if judged.get(d, -1) >= 2],
            # A non-relevant docid can carry (or contain) the text of a relevant one (MS MARCO near-duplicates).
            judged=[(d, t) for d, t in hits if judged.get(d, -1) == 0 and not contains_any(t, related_texts)],
            unjudged=[(d, t) for d, t in hits if d not in judged and not contains_any(t, related_texts)],
        ))
    return topics


def contains_any(text: str, others: set[str]) -> bool:
    """``text`` equals, contains or is contained in one of ``others``."""
    return any(o in text or text in o for o in others)


class FillerStream:
    """Non-relevant passages of one query, concatenated to an exact token length."""

    def __init__(self, passages: list[Encoded]):
        if not passages:
            raise ValueError("no non-relevant passages to build filler from")
        self.passages = passages

    def draw_disjoint(self, lengths: list[int], rng) -> list[list[Encoded]]:
        """One filler per length, no passage in two of them (until the pool runs out and is reshuffled)."""
        order: list[int] = []
        out = []
        for n_tokens in lengths:
            pieces, have = [], 0
            while have < n_tokens:
                if not order:
                    order = rng.sample(range(len(self.passages)), len(self.passages))
                piece = self.passages[order.pop()]
                if have + len(piece) > n_tokens:
                    piece = cut(piece, 0, n_tokens - have)
                pieces.append(piece)
                have += len(piece)
            out.append(pieces)
        return out

    def draw(self, n_tokens: int, rng) -> list[Encoded]:
        """Shuffled passages totalling exactly ``n_tokens`` tokens (the last one cut).

        A pool shorter than ``n_tokens`` is reshuffled and reused: repeats then
        happen, but only of non-relevant text."""
        out, have = [], 0
        while have < n_tokens:
            for i in rng.sample(range(len(self.passages)), len(self.passages)):
                piece = self.passages[i]
                if have + len(piece) > n_tokens:
                    piece = cut(piece, 0, n_tokens - have)
                out.append(piece)
                have += len(piece)
                if have >= n_tokens:
                    break
        return out


def cut(enc: Encoded, start: int, end: int) -> Encoded:
    """Tokens [start, end) of a passage as their own text (a word-piece prefix re-tokenizes the same).

    Cuts fall at token starts, so a prefix and its suffix add up to the whole
    text (characters the tokenizer skips, such as control characters, are kept)."""
    a = int(enc.offsets[start, 0]) if start > 0 else 0
    b = int(enc.offsets[end, 0]) if end < len(enc) else len(enc.text)
    return Encoded(ids=enc.ids[start:end], offsets=enc.offsets[start:end] - a, text=enc.text[a:b], truncated=True)


def split_at(pieces: list[Encoded], n_tokens: int) -> tuple[list[Encoded], list[Encoded]]:
    """The first ``n_tokens`` tokens of a stream and the rest (a passage may be split in two)."""
    before, after, have = [], [], 0
    for piece in pieces:
        if have >= n_tokens:
            after.append(piece)
        elif have + len(piece) <= n_tokens:
            before.append(piece)
        else:
            k = n_tokens - have
            before.append(cut(piece, 0, k))
            after.append(cut(piece, k, len(piece)))
        have += len(piece)
    return before, after


def join(pieces: list[Encoded]) -> str:
    """Passages joined by one space: whitespace adds no word pieces, so token counts add up."""
    return " ".join(p.text for p in pieces if p.text)


def insert(filler: list[Encoded], passage: Encoded, offset: int) -> tuple[str, tuple[int, int]]:
    """Document text with ``passage`` starting at token ``offset``, and its char span."""
    before, after = split_at(filler, offset)
    head = join(before)
    start = len(head) + 1 if head else 0
    text = " ".join(t for t in (head, passage.text, join(after)) if t)
    return text, (start, start + len(passage.text))


def check_offsets(tokenizer: TextTokenizer, texts: list[str], spans: list[tuple[int, int]],
                  passages: list[Encoded], offset: int) -> None:
    """Re-tokenize the built documents (one batched call): each insert must start at exactly ``offset``.

    Only the text up to the insert's end is re-tokenized: a space follows it,
    and the pre-tokenizer splits there, so later text cannot change these tokens."""
    heads = [text[:end] for text, (_, end) in zip(texts, spans)]
    for enc, span, passage in zip(tokenizer.encode_documents(heads), spans, passages):
        starts = np.flatnonzero(enc.offsets[:, 0] == span[0])
        found = int(starts[0]) if starts.size else -1
        if found != offset or not np.array_equal(enc.ids[found:found + len(passage)], passage.ids):
            raise AssertionError(f"inserted passage at token {found}, wanted {offset}")


def usable_topics(data_dir: Path) -> list[str]:
    """DL20 query ids with a relevant passage (grade >= 2) among their BM25 hits, file order."""
    return [t.qid for t in load_topics(data_dir) if t.relevant]


def build(data_dir: Path, tokenizer: TextTokenizer, *, seed: int = 0, offsets: tuple[int, ...] = OFFSETS,
          distractors: int = DISTRACTORS, tail_tokens: int = TAIL_TOKENS, filler: str = "other-topics",
          topics: set[str] | None = None, skipped: dict[str, str] | None = None) -> list[EvalQuery]:
    """One query per (DL20 topic, offset); topics without a relevant BM25 hit are skipped.

    ``topics`` restricts the build to those query ids (sub-sampling). A topic without a non-relevant
    passage left for its filler (``same-topic``: every non-relevant hit is a distractor, as on a small
    judged set) is skipped too, and ``skipped`` (when given) gets its id and why (``NO_FILLER``)."""
    if filler not in FILLERS:
        raise ValueError(f"filler must be one of {FILLERS}, got {filler!r}")
    all_topics = load_topics(data_dir)
    encoded: dict[str, Encoded] = {}
    queries = []
    for topic in all_topics:
        if not topic.relevant or (topics is not None and topic.qid not in topics):
            continue
        rng = query_rng(seed, topic.qid)
        (rel_id, rel_text), negatives = draw_inserts(topic, rng, distractors)
        inserts = tokenizer.encode_documents([rel_text] + [t for _, t in negatives])
        # Every document ends up the same length: filler + its insert = the longest insert + the stream.
        doc_tokens = max(offsets) + tail_tokens + max(len(i) for i in inserts)
        lengths = [doc_tokens - len(i) for i in inserts]
        pool = filler_pool(all_topics, topic, tokenizer, encoded, filler, rel_text, negatives, doc_tokens)
        if not pool:
            if skipped is not None:
                skipped[topic.qid] = NO_FILLER[filler]
            continue
        stream = FillerStream(pool)
        if filler == "same-topic":
            fillers = [stream.draw(n, rng) for n in lengths]
        else:
            fillers = stream.draw_disjoint(lengths, rng)
        for offset in offsets:
            qid = f"{topic.qid}@{offset}"
            texts, spans = zip(*(insert(pieces, passage, offset) for pieces, passage in zip(fillers, inserts)))
            check_offsets(tokenizer, list(texts), list(spans), inserts, offset)
            docs = [Candidate("", text, (span,) if k == 0 else ()) for k, (text, span) in enumerate(zip(texts, spans))]
            queries.append(_ranking(qid, topic.query, docs, seed, str(offset), {
                "topic": topic.qid, "relevant_docid": rel_id, "negative_docids": [d for d, _ in negatives],
                "offset_tokens": offset, "relevant_tokens": len(inserts[0]), "filler": filler,
                "pool_passages": len(stream.passages), "pool_tokens": int(sum(len(p) for p in stream.passages)),
            }, spans))
    return queries


def filler_pool(all_topics: list[TopicPool], topic: TopicPool, tokenizer: TextTokenizer, encoded: dict[str, Encoded],
                filler: str, rel_text: str, negatives: list[tuple[str, str]], needed_tokens: int) -> list[Encoded]:
    """The passages ``topic``'s filler is drawn from (``filler``), none of its inserts among them; [] when none is
    left (whatever ``needed_tokens`` >= 1 is: a pool that is empty for one token is empty for any)."""
    exclude = {t for _, t in negatives}
    if filler == "same-topic":
        return pool_for(topic, tokenizer, needed_tokens, exclude=exclude)
    return off_topic_pool(all_topics, topic, tokenizer, encoded, exclude | {rel_text})


def off_topic_pool(all_topics: list[TopicPool], topic: TopicPool, tokenizer: TextTokenizer,
                   encoded: dict[str, Encoded], exclude: set[str]) -> list[Encoded]:
    """Judged non-relevant passages of the other queries, minus anything among this query's BM25 hits.

    ``encoded`` caches tokenizations across queries (the pools overlap almost entirely)."""
    own = {t for _, t in topic.relevant + topic.judged + topic.unjudged}
    related = {t for _, t in topic.relevant} | exclude
    texts = [t for other in all_topics if other.qid != topic.qid for _, t in other.judged
             if t not in own and not contains_any(t, related)]
    missing = [t for t in dict.fromkeys(texts) if t not in encoded]
    if missing:
        encoded.update(zip(missing, tokenizer.encode_documents(missing)))
    return [encoded[t] for t in dict.fromkeys(texts) if len(encoded[t])]


def build_bare(data_dir: Path, tokenizer: TextTokenizer, *, seed: int = 0, distractors: int = DISTRACTORS,
               topics: set[str] | None = None, filler: str | None = None,
               skipped: dict[str, str] | None = None) -> list[EvalQuery]:
    """The short-document ceiling: the same inserts as ``build``, as bare passages.

    With ``filler``, the topics ``build`` skips for want of filler are skipped here too (and put in
    ``skipped``), so the ceiling and the long documents cover the same topics."""
    queries = []
    all_topics = load_topics(data_dir)
    encoded: dict[str, Encoded] = {}
    for topic in all_topics:
        if not topic.relevant or (topics is not None and topic.qid not in topics):
            continue
        (rel_id, rel_text), negatives = draw_inserts(topic, query_rng(seed, topic.qid), distractors)
        if filler is not None and not filler_pool(all_topics, topic, tokenizer, encoded, filler, rel_text, negatives, 1):
            if skipped is not None:
                skipped[topic.qid] = NO_FILLER[filler]
            continue
        docs = [Candidate("", rel_text, ((0, len(rel_text)),))] + [Candidate("", t) for _, t in negatives]
        spans = [(0, len(d.text)) for d in docs]
        queries.append(_ranking(f"{topic.qid}@bare", topic.query, docs, seed, "bare", {
            "topic": topic.qid, "relevant_docid": rel_id, "negative_docids": [d for d, _ in negatives],
        }, spans))
    return queries


def draw_inserts(topic: TopicPool, rng, distractors: int) -> tuple[tuple[str, str], list[tuple[str, str]]]:
    """The relevant passage and the non-relevant ones inserted into the distractors (judged ones preferred).

    The first draws of the query's generator, so ``build`` and ``build_bare`` agree."""
    relevant = rng.choice(topic.relevant)
    candidates = topic.judged if len(topic.judged) >= distractors else (topic.judged + topic.unjudged)
    negatives = rng.sample(candidates, min(distractors, len(candidates)))
    return relevant, negatives


def pool_for(topic: TopicPool, tokenizer: TextTokenizer, needed_tokens: int, exclude: set[str]) -> list[Encoded]:
    """Judged non-relevant passages, topped up with unjudged hits only if they cannot fill a document.

    ``exclude``: the inserted non-relevant passages, so an insert is nowhere else."""
    judged = [t for _, t in topic.judged if not contains_any(t, exclude)]
    pool = tokenizer.encode_documents(judged) if judged else []
    have = sum(len(p) for p in pool)
    for _, text in topic.unjudged:
        if have >= needed_tokens:
            break
        if contains_any(text, exclude):
            continue
        enc = tokenizer.encode_documents([text])[0]
        pool.append(enc)
        have += len(enc)
    return [p for p in pool if len(p)]


def _ranking(qid: str, query: str, docs: list[Candidate], seed: int, bucket: str, meta: dict,
             spans: list[tuple[int, int]]) -> EvalQuery:
    """Shuffle the candidates and give them opaque ids, so neither order nor id reveals the target.

    ``spans``: each document's insert, kept in ``meta["inserts"]`` by doc id; ``meta["construction"]`` is the
    seed that drew inserts and filler (PSI's noise is measured within one construction, report.py)."""
    order = list(range(len(docs)))
    query_rng(seed, qid).shuffle(order)
    candidates = [Candidate(f"d{slot:02d}", docs[i].text, docs[i].evidence) for slot, i in enumerate(order)]
    target = candidates[order.index(0)].doc_id
    meta = {**meta, "construction": seed, "inserts": {c.doc_id: list(spans[i]) for c, i in zip(candidates, order)}}
    return EvalQuery(qid=qid, query=query, candidates=candidates, qrels={target: 1}, bucket=bucket, meta=meta)
