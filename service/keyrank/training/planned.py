"""Training inputs, planned by the serving pipeline, and the groups a step trains on.

Each judged query is planned as ONE request over its whole candidate group
(``Pipeline.plan``, exactly as the server does: BM25's IDF comes from the
candidate set), so a training sequence is the served sequence. A training
group is then one relevant document and ``negatives`` sampled non-relevant
ones of the same query, with all their sequences (MaxP: every window, the
document's score is the max, as RankLLaMA-MaxP is trained).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from keyrank.data.judged import JudgedQuery
from keyrank.pipeline import Pipeline, RerankOptions, Resolved
from keyrank.scoring import ModelInputs
from keyrank.strategies import REGISTRY, StrategySpec

TRAINABLE = tuple(name for name, spec in REGISTRY.items() if spec.trainable)
"""Strategies ``keyrank finetune`` trains (the scorer, PARADE's aggregator, or an interaction head): the registry's
``trainable`` rows."""


def planning_strategy(name: str) -> str:
    """The registry row whose plan a strategy trains on: its own, or the row its ``plans_as`` names (PARADE-Attn and
    -Transformer cut like parade-max, CEDR's heads like avgp: their own rows need the trained file that training is
    about to write)."""
    return REGISTRY[name].plans_as or name


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    """A judged query with the model inputs the server would score for it."""

    judged: JudgedQuery
    """The query, its candidates and grades."""
    ids: list[np.ndarray]
    """int32 [n_s] token ids of each sequence (stored narrow; widened when batched)."""
    types: list[np.ndarray]
    """int8 [n_s] token types of each sequence."""
    firsts: np.ndarray
    """int64 [D + 1] sequences of document d are ``firsts[d]:firsts[d + 1]``."""
    roles: list[np.ndarray] | None = None
    """int8 [n_s] query / document / frame positions of each sequence (the interaction graphs read them)."""

    def sequences(self, doc: int) -> range:
        """Indices of document ``doc``'s sequences."""
        return range(int(self.firsts[doc]), int(self.firsts[doc + 1]))

    def model_inputs(self, docs: Sequence[int] | None = None) -> ModelInputs:
        """The sequences of ``docs`` (all when None), in document order, as the scorer takes them."""
        rows = [s for d in (range(len(self.firsts) - 1) if docs is None else docs) for s in self.sequences(d)]
        roles = None if self.roles is None else [self.roles[s] for s in rows]
        return ModelInputs([self.ids[s].astype(np.int64) for s in rows], [self.types[s].astype(np.int64) for s in rows], roles)

    def doc_of(self, docs: Sequence[int] | None = None) -> np.ndarray:
        """int64 [S] position in ``docs`` of each sequence of ``model_inputs(docs)``."""
        docs = range(len(self.firsts) - 1) if docs is None else docs
        return np.repeat(np.arange(len(docs)), [len(self.sequences(d)) for d in docs])


def plan_query(pipeline: Pipeline, judged: JudgedQuery, resolved: Resolved,
               cross_scorer: Callable[[ModelInputs], np.ndarray] | None = None) -> PlannedQuery:
    """One request's plan, kept as compact arrays."""
    plan = pipeline.plan(judged.query, list(judged.texts), resolved, cross_scorer=cross_scorer)
    counts = np.bincount(plan.doc_of, minlength=len(judged.texts))
    return PlannedQuery(
        judged,
        [ids.astype(np.int32) for ids in plan.inputs.ids],
        [types.astype(np.int8) for types in plan.inputs.types],
        np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
        plan.inputs.roles,
    )


def plan_all(pipeline: Pipeline, queries: Sequence[JudgedQuery], resolved: Resolved,
             cross_scorer: Callable[[ModelInputs], np.ndarray] | None = None, *, desc: str = "plan",
             progress: bool = True) -> list[PlannedQuery]:
    """Every query planned as the server would plan it under the one ``resolved`` request (``training_request``;
    a progress bar: a QMSum query group is ~12k tokens to cut and select)."""
    from tqdm.auto import tqdm  # the eval extra's: imported by a run, not by `keyrank finetune --help`

    return [plan_query(pipeline, q, resolved, cross_scorer) for q in tqdm(queries, desc=desc, unit="q", disable=not progress)]


def training_request(pipeline: Pipeline, strategy: str, selector: str | None = None) -> Resolved:
    """The request ``strategy`` (+ ``selector``) is trained on, resolved as the server resolves it (the planning
    row for the trained PARADE aggregators)."""
    return pipeline.resolve(RerankOptions(strategy=planning_strategy(strategy), selector=selector))


@dataclass(frozen=True, slots=True)
class TrainingGroup:
    """What one loss term compares: a relevant document first, then non-relevant ones."""

    query: int
    """Index of the planned query."""
    docs: tuple[int, ...]
    """Candidate indices: ``docs[0]`` relevant, the rest not."""


def epoch_groups(queries: Sequence[PlannedQuery], *, epoch: int, seed: int, negatives: int,
                 max_groups: int | None = None) -> list[TrainingGroup]:
    """The epoch's groups in training order: a pure function of (seed, epoch), so a resumed run
    replays the same order and skips what it had done."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = [i for i, q in enumerate(queries) if q.judged.trainable]
    rng.shuffle(order)
    if max_groups is not None:
        order = order[:max_groups]
    groups = []
    for i in order:
        judged = queries[i].judged
        positive = rng.choice(judged.positives)
        negs = judged.negatives
        groups.append(TrainingGroup(i, (positive, *rng.sample(negs, min(negatives, len(negs))))))
    return groups


def spec_of(strategy: str) -> StrategySpec:
    """The registry row of a trainable strategy."""
    if strategy not in TRAINABLE:
        raise ValueError(f"cannot train strategy {strategy!r}; expected one of {', '.join(TRAINABLE)}")
    return REGISTRY[strategy]
