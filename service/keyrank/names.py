"""The names a request may choose: every strategy and every selector, in their registries' order.

A leaf: it imports nothing. ``config.py`` builds its ``Strategy`` and ``Selector`` types from these
tuples and the registries (``strategies.REGISTRY``, ``select.REGISTRY``) hold one row per name
(tests/test_strategy_registry.py keeps them equal), so the settings never import a registry and every
stage below them can take a typed ``Settings``.
"""

from __future__ import annotations

STRATEGIES: tuple[str, ...] = (
    "firstp", "maxp", "sump", "avgp", "parade-max", "parade-avg", "parade-attn", "parade-transformer",
    "cedr-knrm", "cedr-drmm", "cedr-pacrr", "model1", "keyb2", "keyb2-parade-max", "keyb2-parade-avg",
    "keyb2-blocks", "keyb2-blocks-attn", "longp",
)
"""Every strategy's name (``strategies.REGISTRY``'s rows, in order)."""

SELECTORS: tuple[str, ...] = ("bm25", "dense", "cross", "hybrid")
"""Every block selector's name (``select.REGISTRY``'s rows, in order)."""
