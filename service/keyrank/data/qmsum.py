"""QMSum long-meeting re-ranking: rank the segments of the query's own meeting.

Construction (docs/EVALUATION.md says why): each meeting transcript is cut
into consecutive segments of whole turns, about ``segment_tokens``
cross-encoder tokens each (default 1536 = three model windows), so every
candidate is a long document a truncating reranker cannot read to the end.
A segment's grade comes from the query's evidence turns
(``relevant_text_span``, inclusive turn ranges): 2 if it holds at least half
of the query's evidence tokens, 1 if it holds any evidence turn, else 0.
The position bucket is the token offset, inside the best segment, at which
its first evidence turn starts: where a FirstP reader stops seeing it.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import numpy as np

from keyrank.data.queries import Candidate, EvalQuery, query_rng
from keyrank.tokenize import TextTokenizer

SEGMENT_TOKENS = 1536
"""Default segment size: three 512-token windows, so FirstP reads at most a third."""
OFFSET_BUCKETS = (0, 512, 1024)
"""Bucket edges (tokens into the segment) for the first evidence turn."""


def turn_text(turn: dict) -> str:
    """One transcript line as the reranker sees it."""
    return f"{turn['speaker']}: {turn['content']}"


def evidence_turns(spans: list[list[str]], n_turns: int) -> set[int]:
    """Turn indices named by ``relevant_text_span`` (inclusive string ranges)."""
    turns: set[int] = set()
    for start, end in spans:
        lo, hi = sorted((int(start), int(end)))
        turns.update(range(max(lo, 0), min(hi, n_turns - 1) + 1))
    return turns


def segment_bounds(turn_tokens: np.ndarray, segment_tokens: int) -> list[tuple[int, int]]:
    """Turn ranges [start, end) of consecutive segments of about ``segment_tokens`` tokens.

    The meeting is split into round(total / segment_tokens) parts and every
    cut goes to the turn boundary nearest its equal share, so segments are
    balanced (no stub at the end) and never split a turn."""
    total = int(turn_tokens.sum())
    n_segments = max(1, round(total / segment_tokens))
    ends = np.cumsum(turn_tokens)
    cuts = [0]
    for k in range(1, n_segments):
        boundary = int(np.argmin(np.abs(ends - k * total / n_segments))) + 1
        if boundary > cuts[-1] and boundary < len(turn_tokens):
            cuts.append(boundary)
    cuts.append(len(turn_tokens))
    return list(pairwise(cuts))


def offset_bucket(offset: int, edges: tuple[int, ...] = OFFSET_BUCKETS) -> str:
    """'0-512', '512-1024', '1024+' for a token offset."""
    for lo, hi in pairwise(edges):
        if lo <= offset < hi:
            return f"{lo}-{hi}"
    return f"{edges[-1]}+"


def meeting_queries(meeting_id: str, meeting: dict, tokenizer: TextTokenizer, *,
                    segment_tokens: int, seed: int) -> list[EvalQuery]:
    """The specific queries of one meeting, each over the meeting's segments."""
    turns = [turn_text(t) for t in meeting["meeting_transcripts"]]
    turn_tokens = np.array([len(e) for e in tokenizer.encode_documents(turns)], dtype=np.int64)
    bounds = segment_bounds(turn_tokens, segment_tokens)
    # Segment texts and each turn's char span inside its segment: "\n" joins
    # turns, and whitespace adds no word pieces, so token counts simply add up.
    texts, turn_spans = [], {}
    for start, end in bounds:
        pos = 0
        for i in range(start, end):
            turn_spans[i] = (pos, pos + len(turns[i]))
            pos += len(turns[i]) + 1
        texts.append("\n".join(turns[start:end]))

    queries = []
    for n, item in enumerate(meeting.get("specific_query_list", [])):
        qid = f"{meeting_id}/{n}"
        evidence = evidence_turns(item["relevant_text_span"], len(turns))
        if not evidence:
            continue
        total_evidence = int(turn_tokens[sorted(evidence)].sum())
        candidates, qrels, best = [], {}, (0, -1, 0)
        for s, (start, end) in enumerate(bounds):
            inside = sorted(i for i in evidence if start <= i < end)
            doc_id = f"{meeting_id}/seg{s:02d}"
            spans = _merged(turn_spans[i] for i in inside)
            candidates.append(Candidate(doc_id=doc_id, text=texts[s], evidence=spans))
            held = int(turn_tokens[inside].sum()) if inside else 0
            if held:
                qrels[doc_id] = 2 if 2 * held >= total_evidence else 1
                offset = int(turn_tokens[start:inside[0]].sum())
                best = max(best, (held, -s, offset))
        query_rng(seed, qid).shuffle(candidates)
        held, neg_s, offset = best
        queries.append(EvalQuery(
            qid=qid, query=item["query"], candidates=candidates, qrels=qrels,
            bucket=offset_bucket(offset),
            meta={"meeting": meeting_id, "segments": len(bounds), "evidence_tokens": total_evidence,
                  "best_segment": -neg_s, "evidence_offset_tokens": offset},
        ))
    return queries


def _merged(spans) -> tuple[tuple[int, int], ...]:
    """Adjacent turn spans (one '\\n' apart) joined into one span."""
    out: list[list[int]] = []
    for start, end in spans:
        if out and start <= out[-1][1] + 1:
            out[-1][1] = end
        else:
            out.append([start, end])
    return tuple((a, b) for a, b in out)


def build(data_dir: Path, tokenizer: TextTokenizer, *, split: str = "val", seed: int = 0,
          segment_tokens: int = SEGMENT_TOKENS) -> list[EvalQuery]:
    """All specific queries of a QMSum split, meetings in file-name order.

    ``train-dev``: the train meetings `keyrank finetune` keeps out of training for its dev
    metric (training/splits.py): the split to choose settings on with a fine-tuned scorer."""
    from keyrank.data.splits import qmsum_dev_meeting

    folder = "train" if split == "train-dev" else split
    queries = []
    for path in sorted((Path(data_dir) / "qmsum" / folder).glob("*.json")):
        if split == "train-dev" and not qmsum_dev_meeting(path.stem):
            continue
        meeting = json.loads(path.read_text(encoding="utf-8"))
        queries.extend(meeting_queries(path.stem, meeting, tokenizer, segment_tokens=segment_tokens, seed=seed))
    return queries
