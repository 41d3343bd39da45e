"""The fixed splits: what may be trained on, what picks epochs, what is reported.

- QMSum: ``train`` meetings are split into training and dev by a hash of the
  meeting id (``DEV_PERCENT`` of meetings are dev); QMSum ``val`` (reported)
  is never read by training.
- DL20 far-relevant: the 54 topics are split by a hash of the query id
  (``dl20_held_back``): 27 of the 52 usable topics are held back (reported, never
  trained on), the other 25 build far-relevant training documents.
- SQuAD far-relevant (``squad-far``): the articles are split by a hash of the
  title (``squad_held_back``: 7 of 16 held back); the other 9 build far-relevant
  training documents (a question's context inserted deep into other articles).

The predicates themselves live in ``keyrank.data.splits`` (evaluation
reports on them too); this module builds the training sets on their side.
"""

from __future__ import annotations

import json
from pathlib import Path

from keyrank.data import farrelevant, qmsum, squad
from keyrank.data.judged import JudgedQuery, from_eval
from keyrank.data.splits import dl20_held_back, qmsum_dev_meeting, squad_held_back
from keyrank.tokenize import TextTokenizer

TASKS = ("qmsum", "farrel", "squad-far")
"""Training sets built by keyrank.data's constructions (their training parts only)."""


def dl20_topics(data_dir: Path, *, held_back: bool) -> set[str]:
    """Usable DL20 topics (a relevant BM25 hit) on one side of the split."""
    return {q for q in farrelevant.usable_topics(data_dir) if dl20_held_back(q) == held_back}


def build(task: str, data_dir: Path, tokenizer: TextTokenizer, *, seed: int = 0,
          offsets: tuple[int, ...] = farrelevant.OFFSETS) -> tuple[list[JudgedQuery], list[JudgedQuery]]:
    """(train, dev) judged queries of a task; dev is empty for the far-relevant ones (their topics all train)."""
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
    if task == "squad-far":
        built = squad.build_far(data_dir, tokenizer, seed=seed, offsets=offsets, articles=squad_articles(data_dir, held_back=False))
        assert not any(squad_held_back(q.meta["article"]) for q in built)
        return from_eval(built, "squad-far", group_of=lambda q: f"{q.meta['article']}#{q.meta['context']}"), []
    raise ValueError(f"unknown training task {task!r}; expected one of {TASKS}")


def squad_articles(data_dir: Path, *, held_back: bool) -> set[str]:
    """SQuAD article titles on one side of the split."""
    data = json.loads((Path(data_dir) / "squad2-dev-half" / "dev-v2.0.json").read_text(encoding="utf-8"))
    return {a["title"] for a in data["data"] if squad_held_back(a["title"]) == held_back}
