"""The fixed splits: what may be trained on, what picks epochs, what is reported.

- QMSum: ``train`` meetings are split into training and dev by a hash of the
  meeting id (``DEV_PERCENT`` of meetings are dev); QMSum ``val`` (reported)
  is never read by training.
- DL20 far-relevant: the 54 topics are split by a hash of the query id
  (``dl20_held_back``): 27 of the 52 usable topics are held back (reported, never
  trained on), the other 25 build far-relevant training documents.

Hashes (crc32 of a salted key) make the split a pure function of the id: the
same on every machine, for every seed, and it does not move when data is added.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from keyrank.evaluation import farrelevant, qmsum
from keyrank.tokenize import TextTokenizer
from keyrank.training.judged import JudgedQuery, from_eval

DL20_SALT = "keyrank/dl20-split/"
"""Salt of the DL20 topic split: changing it re-splits the topics (and invalidates reported numbers)."""
QMSUM_DEV_SALT = "keyrank/qmsum-dev/"
"""Salt of the QMSum train -> (train, dev) meeting split."""
DEV_PERCENT = 10
"""Share of QMSum train meetings kept for the dev metric."""
TASKS = ("qmsum", "farrel")
"""Training sets built by the evaluation's task builders (their training parts only)."""


def _bucket(salt: str, key: str, modulo: int) -> int:
    return zlib.crc32((salt + key).encode("utf-8")) % modulo


def dl20_held_back(qid: str) -> bool:
    """True for the DL20 topics that are reported and never trained on."""
    return _bucket(DL20_SALT, str(qid), 2) == 1


def dl20_topics(data_dir: Path, *, held_back: bool) -> set[str]:
    """Usable DL20 topics (a relevant BM25 hit) on one side of the split."""
    return {q for q in farrelevant.usable_topics(data_dir) if dl20_held_back(q) == held_back}


def qmsum_dev_meeting(meeting: str) -> bool:
    """True for QMSum train meetings kept for the dev metric."""
    return _bucket(QMSUM_DEV_SALT, meeting, 100) < DEV_PERCENT


def build(task: str, data_dir: Path, tokenizer: TextTokenizer, *, seed: int = 0,
          offsets: tuple[int, ...] = farrelevant.OFFSETS) -> tuple[list[JudgedQuery], list[JudgedQuery]]:
    """(train, dev) judged queries of a task; dev is empty for far-relevant (its topics all train)."""
    if task == "qmsum":
        queries = from_eval(qmsum.build(data_dir, tokenizer, split="train", seed=seed), "qmsum",
                            group_of=lambda q: q.meta["meeting"])
        dev = [q for q in queries if qmsum_dev_meeting(q.group.removeprefix("qmsum:"))]
        return [q for q in queries if not qmsum_dev_meeting(q.group.removeprefix("qmsum:"))], dev
    if task == "farrel":
        topics = dl20_topics(data_dir, held_back=False)
        built = farrelevant.build(data_dir, tokenizer, seed=seed, offsets=offsets, topics=topics)
        assert not any(dl20_held_back(q.meta["topic"]) for q in built)
        # Each seed draws other inserts and filler for the same topics: more training documents, same split.
        source = "farrel" if seed == 0 else f"farrel-s{seed}"
        return from_eval(built, source, group_of=lambda q: q.meta["topic"]), []
    raise ValueError(f"unknown training task {task!r}; expected one of {TASKS}")
