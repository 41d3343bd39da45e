"""A scorer that remembers: the same sequence is scored once per evaluation run.

maxp, sump, parade-max/avg and the trained PARADE aggregators all score the
very same windows; keyb2's selectors often pick the same blocks. Scoring each
distinct sequence once makes a full-split run of every strategy affordable on
a CPU. Only the wall time changes (a system whose sequences were scored before
looks fast): cost is reported in scored tokens, which the plan counts.
"""

from __future__ import annotations

import hashlib

import numpy as np

from keyrank.scoring import ModelInputs, Scorer, Scores


class MemoScorer:
    """Wraps a ``Scorer``; answers repeated sequences from memory (logits and pooled vectors)."""

    def __init__(self, inner: Scorer):
        self.inner = inner
        """The scorer that does the work."""
        self.memory: dict[bytes, tuple[float, np.ndarray | None]] = {}
        """Sequence digest -> (logit, pooled or None)."""
        self.hits = 0
        """Sequences answered from memory."""
        self.misses = 0
        """Sequences sent to ``inner``."""

    @property
    def with_graph(self):
        """The inner scorer's ``with_graph`` (None without one): an interaction strategy's graph (CEDR, Model 1)
        is scored by the inner scorer unmemoized, since what it returns are chunk features, not logits."""
        return getattr(self.inner, "with_graph", None)

    @staticmethod
    def _key(ids: np.ndarray, types: np.ndarray) -> bytes:
        return hashlib.blake2b(ids.tobytes() + b"|" + types.tobytes(), digest_size=16).digest()

    async def score(self, inputs: ModelInputs, *, want_pooled: bool, deadline: float) -> Scores:
        keys = [self._key(i, t) for i, t in zip(inputs.ids, inputs.types)]
        unique: dict[bytes, int] = {}  # each digest not known yet (or known without its pooled vector) -> first row
        for k, key in enumerate(keys):
            if key not in self.memory or (want_pooled and self.memory[key][1] is None):
                unique.setdefault(key, k)
        self.hits += len(keys) - len(unique)
        self.misses += len(unique)
        if unique:
            rows = list(unique.values())
            # Always ask for the pooled vectors: they come out of the same forward pass, and maxp (no
            # pooled) scoring the windows first would otherwise make every PARADE variant score them again.
            fresh = await self.inner.score(
                ModelInputs([inputs.ids[k] for k in rows], [inputs.types[k] for k in rows]), want_pooled=True, deadline=deadline
            )
            for j, k in enumerate(rows):
                self.memory[keys[k]] = (float(fresh.logits[j]), None if fresh.pooled is None else fresh.pooled[j])
        logits = np.asarray([self.memory[key][0] for key in keys], np.float32)
        pooled = np.stack([self.memory[key][1] for key in keys]).astype(np.float32) if want_pooled and keys else None
        if want_pooled and not keys:
            pooled = np.zeros((0, 0), np.float32)
        return Scores(logits, pooled)

    async def ready(self, timeout: float) -> bool:
        return await self.inner.ready(timeout)

    async def close(self) -> None:
        await self.inner.close()
