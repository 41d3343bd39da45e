"""The evaluation tasks by name: which construction builds which query list."""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path

from keyrank.data import farrelevant, qmsum, squad
from keyrank.data.judged import TrecFiles, from_trec
from keyrank.data.queries import EvalQuery, subsample
from keyrank.tokenize import TextTokenizer

TASKS = ("qmsum", "farrel", "farrel-bare", "squad")
"""Every query list the evaluation knows; ``farrel-bare`` is the short-document ceiling of ``farrel``."""
USER_TASKS = ("trec",)
"""Query lists from the user's own files (TrecFiles), never part of ``all``."""
ALIASES = {"all": TASKS, "farrel": ("farrel", "farrel-bare")}
"""What a --task name on the command line expands to."""


def trec_queries(files: TrecFiles) -> list[EvalQuery]:
    """The files' queries with at least one relevant candidate (the others say nothing about a ranking)."""
    judged = from_trec(files.qrels, files.docs, files.queries, run_path=files.run, depth=files.depth,
                       relevant_from=files.relevant_from)
    queries = [q.as_eval_query() for q in judged if q.positives]
    if not queries:
        raise ValueError(f"no query in {files.qrels} has a candidate graded >= {files.relevant_from} among its documents "
                         f"in {files.docs}: nothing to measure (check the ids, or lower the relevant grade)")
    if len(queries) < len(judged):
        print(f"trec: {len(judged) - len(queries)} queries without a relevant candidate left out", file=sys.stderr)
    return queries


def expand(names: list[str]) -> list[str]:
    """Command-line task names to task list, in TASKS order, without duplicates."""
    wanted = {t for name in names for t in ALIASES.get(name, (name,))}
    unknown = wanted - set(TASKS + USER_TASKS)
    if unknown:
        raise ValueError(f"unknown task(s) {sorted(unknown)}; choose from {TASKS + USER_TASKS + tuple(ALIASES)}")
    return [t for t in TASKS + USER_TASKS if t in wanted]


def build(task: str, data_dir: Path, tokenizer: TextTokenizer, *, split: str = "val", seed: int = 0,
          max_queries: int | None = None, segment_tokens: int = qmsum.SEGMENT_TOKENS,
          offsets: tuple[int, ...] = farrelevant.OFFSETS,
          distractors: int = farrelevant.DISTRACTORS, filler: str = "other-topics",
          dl20_topics: str = "held-back", trec: TrecFiles | None = None, constructions: int = 1,
          skipped: dict[str, str] | None = None) -> list[EvalQuery]:
    """The (sub-sampled, bucket-stratified) queries of one task; same seed, same queries.

    ``dl20_topics``: ``held-back`` (default: the topics `keyrank finetune` never trains on,
    training/splits.py), ``train`` or ``all``. ``constructions`` (far-relevant only): that many
    draws of inserts and filler per topic, seeds ``seed`` .. ``seed + constructions - 1``, each
    ranking's id suffixed ``#<seed>`` when there is more than one; 27 rankings per offset bucket
    leave per-offset means and PSI too noisy to tell 0.05 from 0.1 (docs/EVALUATION.md).

    ``skipped`` (far-relevant): filled with the topics left out for want of filler and why (their id, suffixed
    ``#<seed>`` as the rankings are); ``farrel-bare`` leaves out the same ones, and a build that leaves out every
    topic is an error."""
    if constructions < 1:
        raise ValueError(f"constructions must be >= 1, got {constructions}")
    if task == "qmsum":
        queries = qmsum.build(data_dir, tokenizer, split=split, seed=seed, segment_tokens=segment_tokens)
    elif task in ("farrel", "farrel-bare"):
        # Sub-sample whole topics, the same for both, so every kept topic is seen at every offset.
        pool = dl20_pool(data_dir, dl20_topics)
        topics = set(pool)
        if max_queries is not None:
            topics = subsample_topics(pool, max(1, max_queries // len(offsets)), seed)
        built, left_out = [], {}
        for s in range(seed, seed + constructions):
            left = {}
            if task == "farrel":
                one = farrelevant.build(data_dir, tokenizer, seed=s, offsets=offsets, distractors=distractors,
                                        filler=filler, topics=topics, skipped=left)
            else:
                one = farrelevant.build_bare(data_dir, tokenizer, seed=s, distractors=distractors, topics=topics,
                                             filler=filler, skipped=left)
            built += one if constructions == 1 else [replace(q, qid=f"{q.qid}#{s}") for q in one]
            left_out.update({(qid if constructions == 1 else f"{qid}#{s}"): why for qid, why in left.items()})
        if left_out:
            print(f"{task}: {len(left_out)} topic(s) left out: " + "; ".join(f"{q}: {why}" for q, why in left_out.items()),
                  file=sys.stderr)
            if skipped is not None:
                skipped.update(left_out)
        if not built and left_out:
            raise ValueError(f"{task}: no far-relevant topic could be built from {Path(data_dir) / 'trec-dl20-passage'}: "
                             f"{next(iter(left_out.values()))}")
        return built
    elif task == "squad":
        queries = squad.build(data_dir, seed=seed)
    elif task == "trec":
        if trec is None:
            raise ValueError("the trec task reads your files: give --qrels, --docs and --queries")
        queries = trec_queries(trec)
    else:
        raise ValueError(f"unknown task {task!r}")
    return subsample(queries, max_queries, seed)


def dl20_pool(data_dir: Path, which: str) -> list[str]:
    """Usable DL20 topics on one side of the fixed train / held-back split (or all of them)."""
    from keyrank.data.splits import dl20_held_back

    usable = farrelevant.usable_topics(data_dir)
    if which == "all":
        return list(usable)
    if which not in ("held-back", "train"):
        raise ValueError(f"dl20_topics must be held-back, train or all, not {which!r}")
    return [q for q in usable if dl20_held_back(q) == (which == "held-back")]


def subsample_topics(topics: list[str], n_topics: int, seed: int) -> set[str]:
    """A seeded choice of DL20 topics, the same for the long documents and the ceiling."""
    if n_topics >= len(topics):
        return set(topics)
    return set(random.Random(seed).sample(sorted(topics), n_topics))
