"""Realistic /rerank payloads for the load test, built from QMSum meetings.

A QMSum meeting (~9k words) is cut into consecutive passages of 1-3k tokens;
a request pairs one of the meeting's human queries with the passage that holds
its evidence, the meeting's other passages (hard negatives) and passages of
other meetings, up to `docs_per_query` candidates. That is the shape the
service exists for: long candidates whose relevant text sits far from the start.

Pure Python and standard library only, so the locustfile, the runner and the
tests share it without importing locust.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# DESIGN.md: the data lives next to the repository, never inside it.
DEFAULT_DATASETS = REPO_ROOT / ".." / "shared" / "datasets"

# English BERT WordPiece yields ~1.3 tokens per whitespace word: lengths are
# set in tokens (what the model reads) and cut in words (no tokenizer needed).
TOKENS_PER_WORD = 1.3

# Load-test scenario label -> (strategy, selector) of the /rerank body; one
# locust user class per label (locustfile.py), so each is run and reported alone.
SCENARIOS: dict[str, tuple[str, str | None]] = {
    "firstp": ("firstp", None),
    "maxp": ("maxp", None),
    "sump": ("sump", None),
    "avgp": ("avgp", None),
    "parade-max": ("parade-max", None),
    "parade-avg": ("parade-avg", None),
    "keyb2": ("keyb2", "bm25"),
    "keyb2-dense": ("keyb2", "dense"),
    "keyb2-cross": ("keyb2", "cross"),
    "keyb2-blocks": ("keyb2-blocks", "bm25"),  # the gateway's default strategy
}


def user_class_name(scenario: str) -> str:
    """Locust user class of a scenario: "keyb2-dense" -> "Keyb2DenseUser"."""
    return "".join(part.capitalize() for part in scenario.split("-")) + "User"


@dataclass(frozen=True)
class LoadConfig:
    """Payload shape, read from LOADTEST_* environment variables."""

    datasets: Path  # folder holding qmsum/ (LOADTEST_DATASETS)
    split: str  # QMSum split: val (honest) or train (LOADTEST_SPLIT)
    payloads: int  # distinct requests built per locust process (LOADTEST_PAYLOADS)
    docs_per_query: int  # candidates per request (LOADTEST_DOCS_PER_QUERY)
    min_tokens: int  # shortest candidate, approximate tokens (LOADTEST_MIN_TOKENS)
    max_tokens: int  # longest candidate, approximate tokens (LOADTEST_MAX_TOKENS)
    top_n: int  # results asked for (LOADTEST_TOP_N)
    seed: int  # makes the payloads reproducible (LOADTEST_SEED)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> LoadConfig:
        env = os.environ if env is None else env
        config = cls(
            datasets=Path(env.get("LOADTEST_DATASETS", str(DEFAULT_DATASETS))),
            split=env.get("LOADTEST_SPLIT", "val"),
            payloads=int(env.get("LOADTEST_PAYLOADS", "16")),
            docs_per_query=int(env.get("LOADTEST_DOCS_PER_QUERY", "64")),
            min_tokens=int(env.get("LOADTEST_MIN_TOKENS", "1000")),
            max_tokens=int(env.get("LOADTEST_MAX_TOKENS", "3000")),
            top_n=int(env.get("LOADTEST_TOP_N", "10")),
            seed=int(env.get("LOADTEST_SEED", "0")),
        )
        if not 0 < config.min_tokens <= config.max_tokens:
            raise ValueError(f"need 0 < LOADTEST_MIN_TOKENS <= LOADTEST_MAX_TOKENS, got {config.min_tokens}, {config.max_tokens}")
        return config


@dataclass(frozen=True)
class Passage:
    """A run of consecutive transcript turns, one rerank candidate."""

    id: str  # "<meeting>:<first turn>-<last turn>"
    meeting: str  # QMSum file stem
    first_turn: int  # index of the first turn (inclusive)
    last_turn: int  # index of the last turn (inclusive)
    text: str  # "Speaker: words" lines
    words: int  # whitespace words in text


@dataclass(frozen=True)
class Meeting:
    """One QMSum transcript with its specific queries."""

    name: str  # file stem, e.g. "IS1008b"
    turns: list[str]  # "Speaker: content" per turn
    queries: list[tuple[str, int, int]]  # (query, first evidence turn, last evidence turn)


@dataclass(frozen=True)
class RerankPayload:
    """A query and its candidates, with the candidate that holds the evidence."""

    query: str  # the QMSum human query
    documents: list[Passage]  # candidates, shuffled
    relevant_id: str  # id of the passage holding the query's first evidence turn


def load_meetings(datasets: Path, split: str) -> list[Meeting]:
    """QMSum meetings of one split, sorted by name for reproducibility."""
    folder = datasets / "qmsum" / split
    files = sorted(folder.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no QMSum meetings in {folder} (set LOADTEST_DATASETS)")
    meetings = []
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        turns = [f"{t['speaker']}: {t['content']}" for t in data["meeting_transcripts"]]
        queries = []
        for item in data.get("specific_query_list", []):
            spans = item.get("relevant_text_span") or []
            if spans:
                first, last = int(spans[0][0]), int(spans[0][1])
                queries.append((item["query"], first, last))
        meetings.append(Meeting(path.stem, turns, queries))
    return meetings


def cut_passages(meeting: Meeting, rng: random.Random, min_tokens: int, max_tokens: int) -> list[Passage]:
    """Consecutive passages of whole turns, each of a random length in [min, max] tokens.

    A passage ends at the first turn boundary past its target length; a tail
    shorter than `min_tokens` is left out (queries whose evidence starts there
    are not used).
    """
    passages: list[Passage] = []
    start, words, target = 0, 0, rng.randint(min_tokens, max_tokens) / TOKENS_PER_WORD
    counts = [len(turn.split()) for turn in meeting.turns]
    for i, count in enumerate(counts):
        words += count
        if words >= target:
            passages.append(_passage(meeting, start, i, words))
            start, words, target = i + 1, 0, rng.randint(min_tokens, max_tokens) / TOKENS_PER_WORD
    if words >= min_tokens / TOKENS_PER_WORD:
        passages.append(_passage(meeting, start, len(counts) - 1, words))
    return passages


def _passage(meeting: Meeting, first: int, last: int, words: int) -> Passage:
    text = "\n".join(meeting.turns[first : last + 1])
    return Passage(f"{meeting.name}:{first}-{last}", meeting.name, first, last, text, words)


def build_payloads(config: LoadConfig) -> list[RerankPayload]:
    """`config.payloads` requests of `config.docs_per_query` candidates each."""
    rng = random.Random(config.seed)
    meetings = load_meetings(config.datasets, config.split)
    passages = {m.name: cut_passages(m, rng, config.min_tokens, config.max_tokens) for m in meetings}
    pool = [p for name in sorted(passages) for p in passages[name]]
    if len(pool) < config.docs_per_query:
        raise ValueError(f"only {len(pool)} passages in QMSum {config.split}; lower LOADTEST_DOCS_PER_QUERY")
    asked = [(m, q) for m in meetings for q in m.queries]
    rng.shuffle(asked)
    payloads = []
    for meeting, (query, first, _last) in asked:
        if len(payloads) == config.payloads:
            break
        own = passages[meeting.name]
        relevant = next((p for p in own if p.first_turn <= first <= p.last_turn), None)
        if relevant is None:  # evidence span past the transcript's end: a data error, skip it
            continue
        # Hard negatives first (same meeting), then other meetings' passages.
        negatives = [p for p in own if p is not relevant]
        rng.shuffle(negatives)
        others = [p for p in pool if p.meeting != meeting.name]
        rng.shuffle(others)
        documents = [relevant, *negatives, *others][: config.docs_per_query]
        rng.shuffle(documents)
        payloads.append(RerankPayload(query, documents, relevant.id))
    return payloads


def rerank_body(payload: RerankPayload, scenario: str, top_n: int) -> dict:
    """JSON body of POST /rerank for one scenario."""
    strategy, selector = SCENARIOS[scenario]
    body: dict = {
        "query": payload.query,
        "documents": [{"id": p.id, "text": p.text} for p in payload.documents],
        "strategy": strategy,
        "top_n": top_n,
        "return_evidence": True,
    }
    if selector is not None:
        body["selector"] = selector
    return body


def ranking_problem(answer: dict, n_documents: int, top_n: int) -> str | None:
    """Why a 200 answer is not a valid ranking, or None when it is."""
    results = answer.get("results")
    if not isinstance(results, list):
        return "no results list"
    if len(results) != min(top_n, n_documents):
        return f"{len(results)} results for top_n={top_n} over {n_documents} documents"
    indices = [r.get("index") for r in results]
    if len(set(indices)) != len(indices) or not all(isinstance(i, int) and 0 <= i < n_documents for i in indices):
        return f"bad result indices {indices}"
    scores = [r.get("relevance_score") for r in results]
    if any(a < b for a, b in zip(scores, scores[1:])):
        return "results not sorted by relevance_score"
    return None
