"""After fine-tuning, which reader serves the new scorer best: each of the run's ``readers`` (training/recipe.py ``READERS`` by default on the command line) ranks the run's dev queries with
the fine-tuned checkpoint as it will be served (prepared, in-process), and the best by dev nDCG@10 is written
beside the checkpoint as its serving settings (``keyrank-serving.env``), which `keyrank prepare` carries into the
prepared folder and `keyrank serve` reads under the environment (keyrank/config.py, ``serving_defaults``).

A fine-tuned scorer moves the readers apart: the windows gain more than keyb2-blocks from the same training
(docs/TRAINING.md), so the service must not keep serving a reader the run measured worse on dev.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from keyrank.config import SERVING_FILE, SERVING_WARNING, variable
from keyrank.data.judged import JudgedQuery
from keyrank.data.runs import per_query
from keyrank.prepare.export import CHECKPOINT_SERVING_FILE
from keyrank.strategies import REGISTRY
from keyrank.training.run import DEV_MEASURES, FinetuneResult, TrainingRun

BLOCKS = "keyb2-blocks"
LENGTH_BIASES = (0.0, 0.5, 1.0)
"""The ``keyb2_blocks_length_bias`` values keyb2-blocks is read at with the new scorer: 0 (the base scorer's) and the
two that lifted a scorer fine-tuned on keyb2's 512-token inputs on both dev sets (docs/EXPERIMENTS.md, 2026-12-02)."""


def measure(run: TrainingRun, result: FinetuneResult, dev: Sequence[JudgedQuery], readers: tuple[str, ...],
            prepared: Path) -> dict | None:
    """Dev nDCG@10 (and RR@10, model tokens per query) of each reader with the checkpoint prepared in ``prepared``,
    and of the starting checkpoint (``--model``) with the strategy served before (``default_strategy``); writes the best reader's settings
    beside the checkpoint and into ``prepared``, and says so when no reader of the new scorer beats the starting one.
    None when there is nothing to measure (no checkpoint, no dev queries, no readers)."""
    from keyrank.reranker import Reranker

    if result.model_dir is None or not dev or not readers:
        return None
    queries = [judged.as_eval_query() for judged in dev]
    selector = run.config.selector or "bm25"
    settings = run.settings.with_overrides(model_dir=prepared)
    reranker = Reranker.local(settings=settings, threads=run.config.threads or 0)
    try:
        table = {strategy: _read(reranker, queries, strategy, selector) for strategy in readers}
    finally:
        reranker.close()
    if BLOCKS in table:
        table[BLOCKS] = _weighed_by_length(run, settings, queries, selector, table[BLOCKS])
    before = run.settings.default_strategy
    base = {"strategy": before, **_read(run.reranker(), queries, before, selector)}
    first = DEV_MEASURES[0]
    best = max(readers, key=lambda s: (table[s][first], -readers.index(s)))
    chosen = {"default_strategy": best, "default_selector": selector}
    if BLOCKS in table:  # how this scorer's keyb2-blocks inputs are weighed, whichever reader is the default
        chosen["keyb2_blocks_length_bias"] = table[BLOCKS]["length_bias"]
    warning = _not_better(table[best][first], base, run.config.model) if table[best][first] <= base[first] else None
    text = serving_file(chosen, table, base, len(queries), warning)
    (result.model_dir / CHECKPOINT_SERVING_FILE).write_text(text)
    (prepared / "gateway" / SERVING_FILE).write_text(text)
    if warning:
        _log(f"warning: {warning}")
    return {"dev_queries": len(queries), "readers": table, "best": best, "settings": chosen, "base": base}


def _weighed_by_length(run: TrainingRun, settings, queries: list, selector: str, row: dict) -> dict:
    """keyb2-blocks' row at the best of ``LENGTH_BIASES`` (and the run's own ``keyb2_blocks_length_bias``, ``row``'s)
    by dev nDCG@10, a tie going to the smaller: a scorer trained on 512-token inputs can weigh short inputs
    differently from long ones."""
    from keyrank.reranker import Reranker

    own = settings.keyb2_blocks_length_bias
    rows = {own: {**row, "length_bias": own}}
    for bias in sorted(set(LENGTH_BIASES) - {own}):
        reranker = Reranker.local(settings=settings.with_overrides(keyb2_blocks_length_bias=bias), threads=run.config.threads or 0)
        try:
            rows[bias] = {**_read(reranker, queries, BLOCKS, selector, f"length bias {bias}"), "length_bias": bias}
        finally:
            reranker.close()
    first = DEV_MEASURES[0]
    best = max(rows.values(), key=lambda r: (r[first], -abs(r["length_bias"])))
    return {**best, "by_length_bias": {str(b): r[first] for b, r in sorted(rows.items())}}


def _read(reranker, queries: list, strategy: str, selector: str, note: str = "") -> dict:
    """One reader's dev metrics: every query ranked as a request would be, every candidate returned."""
    from keyrank.data.runs import QueryRun

    chosen = selector if REGISTRY[strategy].needs_selector else None
    runs, tokens = [], []
    for query in queries:
        texts = [c.text for c in query.candidates]
        ranking = reranker.rank(query.query, texts, strategy=strategy, selector=chosen, top_n=len(texts))
        runs.append(QueryRun(query.qid, strategy, {query.candidates[r.index].doc_id: float(r.score) for r in ranking.results}))
        tokens.append(ranking.usage.scored_tokens)
    values = per_query(queries, runs, DEV_MEASURES)
    by_source: dict[str, list[dict]] = {}
    for qid, measured in values.items():
        by_source.setdefault(source_of(qid), []).append(measured)
    # each source counts once: 95 meetings' queries and 125 far-relevant rankings pull the choice alike
    row = {m: round(float(np.mean([np.mean([v[m] for v in rows]) for rows in by_source.values()])), 4) for m in DEV_MEASURES}
    row["tokens_per_query"] = round(float(np.mean(tokens)))
    row["by_source"] = {s: round(float(np.mean([v[DEV_MEASURES[0]] for v in rows])), 4) for s, rows in sorted(by_source.items())}
    _log(f"dev, {strategy}{f' ({note})' if note else ''}: {row}")
    return row


def source_of(qid: str) -> str:
    """The dev set a query comes from: its id's prefix (``qmsum``, ``farrel-s9``, ``trec``)."""
    return qid.split(":", 1)[0] if ":" in qid else "dev"


def _not_better(best: float, base: dict, model: str) -> str:
    return (f"no reader of the fine-tuned scorer beats the starting scorer read by {base['strategy']} on dev ({best:.4f} <= "
            f"{base[DEV_MEASURES[0]]:.4f}): serving the starting model ({model}, `keyrank prepare --model {model}`) "
            f"keeps the better ranking")


def serving_file(chosen: dict[str, str], table: dict[str, dict], base: dict, n: int, warning: str | None = None) -> str:
    """``KEYRANK_*=value`` lines, after comments that say what they rest on (and ``warning``, when the starting
    scorer reads better)."""
    first = DEV_MEASURES[0]
    measured = ", ".join(f"{s}{_bias_label(row)} {row[first]:.4f}" for s, row in table.items())
    lines = [f"# keyrank finetune, {datetime.date.today().isoformat()}: dev {first} of this scorer per reader "
             f"({n} dev queries): {measured}; the starting scorer by {base['strategy']}: {base[first]:.4f}",
             "# the best is served by default; a KEYRANK_* variable of the environment overrides it"]
    if warning:
        lines.append(f"{SERVING_WARNING}{warning}")
    return "\n".join(lines + [f"{variable(k)}={v}" for k, v in chosen.items()]) + "\n"


def markdown(readers: dict) -> str:
    """The report's closing table."""
    base = readers["base"]
    sources = list(base["by_source"])
    rows = [f"| {s}{_bias_label(row)}{' (served)' if s == readers['best'] else ''} | {row[DEV_MEASURES[0]]:.4f} | "
            + "".join(f"{row['by_source'][source]:.4f} | " for source in sources)
            + f"{row[DEV_MEASURES[1]]:.4f} | {row['tokens_per_query']:,} |"
            for s, row in [*readers["readers"].items(), (f"{base['strategy']}, the starting scorer", base)]]
    return "\n".join([f"dev ({readers['dev_queries']} queries), the fine-tuned scorer:", "",
                      f"| reader | {DEV_MEASURES[0]} (mean of the sources) | " + "".join(f"{s} | " for s in sources)
                      + f"{DEV_MEASURES[1]} | model tokens / query |", "| --- | ---: | " + "---: | " * len(sources) + "---: | ---: |",
                      *rows])


def _bias_label(row: dict) -> str:
    return f", length bias {row['length_bias']}" if row.get("length_bias") else ""


def _log(message: str) -> None:
    print(f"[finetune] {message}", file=sys.stderr, flush=True)
