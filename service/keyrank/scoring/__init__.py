"""Stage 5: score assembled sequences with the cross-encoder, behind one interface.

``Scorer`` is what the pipeline needs of a model: ``score`` whole sequences
(the template's ids and token types), ``ready``, ``close``. Implementations:

- ``TritonScorer`` (scoring/triton.py): async gRPC to Triton, the service default;
- ``LocalScorer`` (scoring/local.py): the same ``model.onnx`` in-process with ONNX
  Runtime, for notebooks, tests and small CPU deployments (``Reranker.local``).

Decoder (yes/no) rerankers need nothing more: their export already answers
``logits`` = logit(yes) - logit(no) of the last real token of right-padded rows.
Both pad to length buckets: Triton's dynamic batcher only merges equal shapes,
and ONNX Runtime runs faster on a few fixed shapes than on every length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from keyrank.scoring.buckets import choose_edges


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """Sequences to score, each already framed by the model's template."""

    ids: list[np.ndarray]
    """int64 [n_i] token ids of each sequence."""
    types: list[np.ndarray]
    """int64 [n_i] token types of each sequence (zeros for models without them)."""
    roles: list[np.ndarray] | None = None
    """int8 [n_i] query / document / frame positions of each sequence (``InputTemplate.roles``); only the
    interaction graphs (CEDR, Model 1) read them, as their ``token_roles`` input."""

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def tokens(self) -> int:
        """Tokens sent, frame included, padding excluded."""
        return sum(int(ids.shape[0]) for ids in self.ids)

    def __add__(self, other: ModelInputs) -> ModelInputs:
        roles = None if self.roles is None or other.roles is None else self.roles + other.roles
        return ModelInputs(self.ids + other.ids, self.types + other.types, roles)


@dataclass(frozen=True, slots=True)
class Scores:
    """What the model answered for each sequence, in input order."""

    logits: np.ndarray
    """float32 [n] relevance logits."""
    pooled: np.ndarray | None = None
    """float32 [n, H] the vectors the classification head reads (when asked for, for PARADE)."""


@runtime_checkable
class Scorer(Protocol):
    """A cross-encoder the pipeline can score on."""

    async def score(self, inputs: ModelInputs, *, want_pooled: bool, deadline: float) -> Scores:
        """Scores of every sequence; past ``deadline`` (``time.monotonic()``) or with the model
        unreachable raises ``ScoringUnavailable``."""
        ...

    async def ready(self, timeout: float) -> bool:
        """The model answers (within ``timeout`` seconds)."""
        ...

    async def close(self) -> None:
        """Release connections or sessions (idempotent)."""
        ...


@dataclass(frozen=True, slots=True)
class Batch:
    """One model call: rows of the caller's input, padded to one bucket length."""

    rows: np.ndarray
    """int64 [N] positions of these sequences in the caller's list."""
    input_ids: np.ndarray
    """int64 [N, L] token ids, pad id after each sequence."""
    token_type_ids: np.ndarray
    """int64 [N, L] segment ids, 0 on padding."""
    attention_mask: np.ndarray
    """int64 [N, L] 1 on the sequence, 0 on padding."""
    token_roles: np.ndarray | None = None
    """int64 [N, L] ``InputTemplate.roles``, 0 on padding (None when the inputs carry no roles)."""

    @property
    def width(self) -> int:
        """The padded length."""
        return int(self.input_ids.shape[1])

    @property
    def bucket(self) -> str:
        """The padded length, as the metrics label."""
        return str(self.width)

    @staticmethod
    def join(batches: Sequence[Batch]) -> Batch:
        """One batch of the rows of batches of one width."""
        if len(batches) == 1:
            return batches[0]
        if len({b.width for b in batches}) != 1:
            raise ValueError(f"cannot join batches of widths {sorted({b.width for b in batches})}")
        roles = None if any(b.token_roles is None for b in batches) else np.concatenate([b.token_roles for b in batches])
        return Batch(*(np.concatenate([getattr(b, f) for b in batches])
                       for f in ("rows", "input_ids", "token_type_ids", "attention_mask")), roles)

    def feeds(self, *, roles: bool = False) -> dict[str, np.ndarray]:
        """The cross-encoder's three inputs; ``roles``: ``token_roles`` too (an interaction graph's fourth)."""
        feeds = {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "token_type_ids": self.token_type_ids}
        if roles:
            if self.token_roles is None:
                raise ValueError("this graph reads token_roles, which these inputs do not carry")
            feeds["token_roles"] = self.token_roles
        return feeds


def bucket_batches(
    inputs: ModelInputs, *, buckets: Sequence[int], batch_size: int, pad_id: int, max_shapes: int = 0, multiple: int = 32,
    long_buckets: Sequence[int] = (),
) -> list[Batch]:
    """Group sequences by the smallest bucket that fits and cut each group into balanced batches.

    ``max_shapes`` > 0: the buckets are chosen from this request's lengths (scoring/buckets.py), at
    most that many multiples of ``multiple``, never more padding than ``buckets``; 0 = ``buckets``.
    ``long_buckets``: the widths past the longest bucket (longp's, ``buckets.long_widths``), used as they are;
    a batch of one holds no more tokens than ``batch_size`` sequences of the longest bucket.
    """
    if len(inputs.ids) != len(inputs.types):
        raise ValueError(f"{len(inputs.ids)} input_ids but {len(inputs.types)} token_type_ids")
    edges = np.asarray(sorted(buckets), dtype=np.int64)
    longer = np.asarray(sorted(w for w in long_buckets if w > edges[-1]), dtype=np.int64)
    top = int(longer[-1]) if longer.size else int(edges[-1])
    lengths = np.fromiter((len(ids) for ids in inputs.ids), dtype=np.int64, count=len(inputs.ids))
    if lengths.size and (lengths.max() > top or lengths.min() == 0):
        raise ValueError(f"sequence lengths must be in 1..{top}, got {lengths.min()}..{lengths.max()}")
    short_top = int(edges[-1])
    if max_shapes > 0:
        edges = choose_edges(lengths[lengths <= short_top], edges, max_shapes=max_shapes, multiple=multiple)
    edges = np.concatenate([edges, longer])
    which = np.searchsorted(edges, lengths, side="left")
    batches: list[Batch] = []
    for b in np.unique(which):
        members = np.flatnonzero(which == b)
        width = int(edges[b])
        # Attention's memory grows with the square of the width: past the short buckets, fewer rows per batch.
        rows_per_batch = batch_size if width <= short_top else max(1, batch_size * short_top // width)
        # Balanced chunks (e.g. 17 + 16, not 32 + 1) so concurrent requests finish together.
        for rows in np.array_split(members, -(-members.size // rows_per_batch)):
            ids = np.full((rows.size, width), pad_id, dtype=np.int64)
            types = np.zeros((rows.size, width), dtype=np.int64)
            mask = np.zeros((rows.size, width), dtype=np.int64)
            roles = None if inputs.roles is None else np.zeros((rows.size, width), dtype=np.int64)
            for r, row in enumerate(rows):
                n = lengths[row]
                ids[r, :n] = inputs.ids[row]
                types[r, :n] = inputs.types[row]
                mask[r, :n] = 1
                if roles is not None:
                    roles[r, :n] = inputs.roles[row]
            batches.append(Batch(rows, ids, types, mask, roles))
    return batches


def gather(n: int, batches: Sequence[Batch], results: Sequence[tuple[np.ndarray, np.ndarray | None]], want_pooled: bool) -> Scores:
    """Put each batch's answers back at its rows."""
    logits = np.empty(n, dtype=np.float32)
    pooled: np.ndarray | None = None
    for batch, (batch_logits, batch_pooled) in zip(batches, results):
        logits[batch.rows] = batch_logits
        if want_pooled and batch_pooled is not None:
            if pooled is None:
                pooled = np.empty((n, batch_pooled.shape[1]), dtype=np.float32)
            pooled[batch.rows] = batch_pooled
    if want_pooled and pooled is None:
        pooled = np.zeros((n, 0), dtype=np.float32)
    return Scores(logits, pooled)


def relevance(logits: np.ndarray, rows: int) -> np.ndarray:
    """Single-label rerankers answer [N, 1]: the relevance score is its last (only) column."""
    return np.asarray(logits).reshape(rows, -1)[:, -1]
