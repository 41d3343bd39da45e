"""Put several `keyrank eval` runs side by side: the tables of docs/EVALUATION.md.

    python -m keyrank.evaluation.compare base=runs/full-base-qmsum ft=runs/full-ft-qmsum \
        --diff ft:keyb2-bm25 base:maxp --diff ft:keyb2-bm25 ft:maxp

Each run is ``label=folder`` (a folder `keyrank eval --out` wrote). Per task it prints one table
of every system of every run (quality, PSI, scored tokens, quality per position bucket), for
far-relevant each system's nDCG@10 per offset as a share of its own bare ceiling (the
``farrel-bare`` task of the same run), and for each ``--diff A B`` the paired difference of
A minus B over the queries both ran, with a 95% bootstrap interval (queries resampled). With
``--plot DIR`` it also draws, per task, quality against scored tokens with every ``label:system``
of the runs as one point (the quality-versus-tokens curve of settings run separately, e.g. one run
per ``KEYRANK_KEYB2_BLOCKS``). Nothing is re-scored: it reads ``results.json`` and the per-query
metrics in ``runs/<task>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from keyrank.evaluation.plots import quality_vs_cost

BOOTSTRAP = 10_000
"""Resamples of the queries for a difference's interval."""


@dataclass
class Run:
    label: str
    results: dict
    """results.json: {task: summary}."""
    folder: Path

    def per_query(self, task: str) -> dict[str, dict[str, dict[str, float]]]:
        """{system: {qid: {measure: value}}} of a task."""
        return json.loads((self.folder / "runs" / f"{task}.json").read_text())["per_query"]


def load(spec: str) -> Run:
    label, sep, folder = spec.partition("=")
    if not sep or not label:
        raise SystemExit(f"{spec!r}: give runs as label=folder")
    path = Path(folder)
    if not (path / "results.json").exists():
        raise SystemExit(f"{path / 'results.json'} not found: give a folder `keyrank eval --out` wrote")
    return Run(label, json.loads((path / "results.json").read_text()), path)


def paired_difference(a: dict[str, float], b: dict[str, float], *, seed: int = 0,
                      resamples: int = BOOTSTRAP) -> tuple[float, float, float, int]:
    """(mean of a - b, 2.5th and 97.5th bootstrap percentiles, queries) over the queries in both."""
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError("the two systems share no query")
    diff = np.array([a[q] - b[q] for q in common])
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(diff.mean()), float(low), float(high), len(common)


def bare_ratios(run: Run, system: str, measure: str = "nDCG@10") -> dict[str, float] | None:
    """Far-relevant per offset, divided by the same system's score on the bare passages (the ceiling)."""
    far, bare = run.results.get("farrel"), run.results.get("farrel-bare")
    if not far or not bare or system not in far["systems"] or system not in bare["systems"]:
        return None
    ceiling = bare["systems"][system]["metrics"][measure]
    if ceiling <= 0:
        return None
    return {offset: values[measure] / ceiling for offset, values in far["systems"][system]["by_bucket"].items()}


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def task_table(runs: Sequence[Run], task: str, measures: Sequence[str] = ("nDCG@10", "RR@10", "R@5")) -> str:
    """Every system of every run on one task, with its buckets and (far-relevant) bare ratios."""
    present = [r for r in runs if task in r.results]
    if not present:
        return ""
    first = present[0].results[task]
    buckets = list(first["buckets"])
    head = ["system", "scorer", *measures, f"PSI {measures[0]}", "tokens/query",
            *(f"{measures[0]} {b}" for b in buckets)]
    lines = [f"### {task}: {first['queries']} queries, {first['candidates_per_query']:.1f} candidates each", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    rnd = first["random"]
    lines.append("| random (expected) | - | " + " | ".join(_f(rnd["metrics"].get(m)) for m in measures)
                 + " | - | - | " + " | ".join(_f(rnd["by_bucket"][b][measures[0]]) for b in buckets) + " |")
    ratios: list[str] = []
    for run in present:
        for name, s in run.results[task]["systems"].items():
            row = [name, run.label, *(_f(s["metrics"].get(m)) for m in measures), _f(s["psi"].get(measures[0])),
                   f"{s['cost']['scored_tokens']:,.0f}", *(_f(s["by_bucket"].get(b, {}).get(measures[0])) for b in buckets)]
            if s.get("errors"):
                row[0] += f" ({s['errors']} errors)"
            lines.append("| " + " | ".join(row) + " |")
            ratio = bare_ratios(run, name, measures[0]) if task == "farrel" else None
            if ratio:
                ceiling = run.results["farrel-bare"]["systems"][name]["metrics"][measures[0]]
                noise = s.get("psi_noise")
                ratios.append(f"| {name} | {run.label} | {_f(ceiling)} | " + " | ".join(_f(ratio.get(b), 2) for b in buckets)
                              + f" | {_f(min(ratio.values()), 2)} | " + (
                                  f"{noise['psi']:.3f} [{noise['interval'][0]:.3f}, {noise['interval'][1]:.3f}] | "
                                  f"{noise['blind_95']:.3f} | {noise['p']:.3f} |" if noise else "- | - | - |"))
    if ratios:
        lines += ["", f"{measures[0]} at each offset as a share of the same system's bare ceiling, and PSI with its "
                  "95% interval over topics beside what a position-blind system scores with the same noise "
                  "(95th percentile of bucket shuffles; p = share of shuffles at or above the PSI):", "",
                  "| system | scorer | bare ceiling | " + " | ".join(buckets) + " | worst | PSI [95%] | blind 95th | p |",
                  "|" + " --- |" * (len(buckets) + 7), *ratios]
    return "\n".join(lines) + "\n"


def diff_line(runs: dict[str, Run], task: str, a: str, b: str, measure: str = "nDCG@10") -> str:
    """``label:system`` minus ``label:system`` on a task, paired by query."""
    values = []
    for spec in (a, b):
        label, _, system = spec.partition(":")
        if label not in runs:
            raise SystemExit(f"--diff {spec}: no run labelled {label!r}")
        per_query = runs[label].per_query(task)
        if system not in per_query:
            raise SystemExit(f"--diff {spec}: {label} has no system {system!r} on {task} (it has {', '.join(per_query)})")
        values.append({q: v[measure] for q, v in per_query[system].items()})
    mean, low, high, n = paired_difference(*values)
    return f"| {a} - {b} | {mean:+.3f} | [{low:+.3f}, {high:+.3f}] | {n} |"


def _lacks(runs: dict[str, Run], spec: str, task: str) -> bool:
    """Whether the run named in ``label:system`` exists but did not run ``task`` (an unknown label is diff_line's error)."""
    run = runs.get(spec.partition(":")[0])
    return run is not None and task not in run.results


def merged_report(runs: Sequence[Run], task: str, drop: Sequence[str] = ()) -> dict | None:
    """One task report of every run's systems, each named ``label:system`` (but those in ``drop``): what
    ``plots.quality_vs_cost`` draws. Chance and the query count are the first run's (runs of one task and
    split share them)."""
    present = [r for r in runs if task in r.results]
    if not present:
        return None
    first = present[0].results[task]
    systems = {f"{r.label}:{name}": s for r in present for name, s in r.results[task]["systems"].items()
               if f"{r.label}:{name}" not in drop}
    return {"task": task, "queries": first["queries"], "measures": first.get("measures", ["nDCG@10"]),
            "random": first["random"], "systems": systems}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keyrank.evaluation.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="label=folder of a `keyrank eval --out` run")
    parser.add_argument("--task", nargs="+", default=None, help="tasks to show (default: all in the runs)")
    parser.add_argument("--diff", nargs=2, action="append", default=[], metavar=("A", "B"),
                        help="label:system label:system; paired difference of A - B")
    parser.add_argument("--measure", default="nDCG@10")
    parser.add_argument("--plot", type=Path, metavar="DIR",
                        help="also write <task>_quality_vs_cost.png there: every label:system against its tokens")
    parser.add_argument("--drop", nargs="+", default=[], metavar="LABEL:SYSTEM", help="systems --plot leaves out")
    args = parser.parse_args(argv)
    runs = [load(spec) for spec in args.runs]
    by_label = {r.label: r for r in runs}
    tasks = args.task or list(dict.fromkeys(t for r in runs for t in r.results))
    out = []
    for task in tasks:
        measures = (args.measure, *(m for m in ("nDCG@10", "RR@10", "R@5") if m != args.measure))
        out.append(task_table(runs, task, measures))
        if args.diff:
            diffs = [diff_line(by_label, task, a, b, args.measure) for a, b in args.diff
                     if not any(_lacks(by_label, spec, task) for spec in (a, b))]
            if diffs:
                out.append("\n".join([f"Paired differences on {task}, {args.measure} (95% bootstrap interval over queries):", "",
                                      "| difference | mean | 95% interval | queries |", "| --- | ---: | --- | ---: |", *diffs]) + "\n")
        report = merged_report(runs, task, args.drop) if args.plot else None
        if report:
            args.plot.mkdir(parents=True, exist_ok=True)
            out.append(f"wrote {quality_vs_cost(report, args.plot / f'{task}_quality_vs_cost.png', args.measure)}\n")
    sys.stdout.write("\n".join(o for o in out if o))
    return 0


if __name__ == "__main__":
    sys.exit(main())
