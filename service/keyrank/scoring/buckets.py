"""Length buckets chosen per request: the padded widths its sequences are sent at.

Triton's dynamic batcher merges only equal shapes, so sequences travel as whole
``[N, L]`` tensors padded to a few widths. A fixed list (64/128/256/384/512)
pays up to ~2x padding inside a bucket: a 140-token firstp passage travels as
256. Here the widths come from the request's own lengths: every width is a
multiple of ``multiple`` (shapes stay few across requests, so the batcher
still merges them and a CUDA graph per width stays affordable) and at most
``max_shapes`` widths are used, placed where they cost the least padding
(dynamic programming over the distinct rounded lengths). If the fixed list
would pad less (it may use more shapes than ``max_shapes``), the fixed list is
used: adaptive never pads more than fixed.

Past the longest fixed width, only longp's inputs go (a long-context model read
whole): there the widths are fixed, four per doubling (640, 768, 896, 1024,
1280, ... up to the model's length, ``long_widths``), so padding stays under a
quarter and Triton's warm-up runs a handful of long shapes, not every multiple.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LENGTH_BUCKETS = (64, 128, 256, 384, 512)
"""The fixed widths (KEYRANK_LENGTH_BUCKETS' default): the one place this list is written."""
LENGTH_MULTIPLE = 32
"""Per-request widths are multiples of this (KEYRANK_LENGTH_BUCKET_MULTIPLE's default)."""


def long_widths(top: int, longest: int) -> tuple[int, ...]:
    """The widths past ``top`` (the longest fixed one) up to ``longest`` (the longest input, ``Settings.longest_input``):
    each doubling cut in four (512 -> 640, 768, 896, 1024 -> 1280, ...), the last one ``longest`` itself."""
    widths, octave = [], top
    while octave < longest:
        widths += [octave + octave * k // 4 for k in (1, 2, 3)]
        octave *= 2
        widths.append(octave)
    return tuple(w for w in widths if w < longest) + ((longest,) if longest > top else ())


def possible_widths(buckets: Sequence[int], *, max_shapes: int, multiple: int, max_length: int) -> tuple[int, ...]:
    """Every width a sequence can travel at: the fixed buckets, plus, when widths are chosen per request
    (``max_shapes`` > 0), every multiple of ``multiple`` up to the longest of them (or ``max_length``), plus the
    long widths up to ``max_length``. Triton's warm-up runs each once, so no request pays a first-shape cost
    (repository writers)."""
    top = max(buckets)
    widths = {b for b in buckets if b <= max_length}
    if max_shapes > 0:
        short = min(top, max_length)
        widths.update(range(multiple, short + 1, multiple))
        widths.add(short)
    widths.update(long_widths(top, max_length))
    return tuple(sorted(widths))


def padded_tokens(lengths: np.ndarray, edges: np.ndarray) -> int:
    """Tokens sent when each sequence is padded to the smallest edge that fits (padding included)."""
    if lengths.size == 0:
        return 0
    return int(edges[np.searchsorted(edges, lengths, side="left")].sum())


def choose_edges(lengths: np.ndarray, fixed: Sequence[int], *, max_shapes: int, multiple: int = 32) -> np.ndarray:
    """int64 sorted widths for this request: at most ``max_shapes`` multiples of ``multiple`` (capped
    at the longest fixed width) with the fewest padded tokens, or ``fixed`` where that pads less."""
    fixed_edges = np.asarray(sorted(fixed), dtype=np.int64)
    if lengths.size == 0 or max_shapes < 1:
        return fixed_edges
    top = int(fixed_edges[-1])
    rounded = np.minimum(-(-lengths // multiple) * multiple, top)
    widths, counts = np.unique(rounded, return_counts=True)
    chosen = _cheapest_widths(widths, counts, max_shapes)
    if padded_tokens(lengths, chosen) > padded_tokens(lengths, fixed_edges):
        return fixed_edges
    return chosen


def _cheapest_widths(widths: np.ndarray, counts: np.ndarray, k: int) -> np.ndarray:
    """At most ``k`` of ``widths`` (the largest always among them) minimising the padded tokens.

    A group's width is its largest rounded length, so only those are candidates; splitting a group
    never pads more, so with more distinct widths than ``k`` exactly ``k`` groups are used.
    best[m, j] = fewest tokens sent for widths[0..j] in m groups, the last at widths[j]. The number of
    distinct widths is at most top / multiple (16 at 512 / 32): the DP takes microseconds.
    """
    u = widths.shape[0]
    if u <= k:
        return widths
    # Tokens sent by a group = its sequences x its width (real tokens are the same for every choice).
    prefix = np.concatenate(([0], np.cumsum(counts)))
    best = np.full((k + 1, u), np.iinfo(np.int64).max // 4, dtype=np.int64)
    back = np.zeros((k + 1, u), dtype=np.int64)
    best[1] = prefix[1:] * widths
    for m in range(2, k + 1):
        for j in range(m - 1, u):
            i = np.arange(m - 2, j)  # the previous group ends at widths[i]
            total = best[m - 1, i] + (prefix[j + 1] - prefix[i + 1]) * widths[j]
            at = int(np.argmin(total))
            best[m, j], back[m, j] = total[at], i[at]
    edges, j = [], u - 1
    for m in range(k, 0, -1):
        edges.append(int(widths[j]))
        j = int(back[m, j])
    return np.asarray(edges[::-1], dtype=np.int64)
