"""PNG figures of a task report: the KeyB2 paper's Figure 9 and Figure 10 views.

Drawn with matplotlib's object API on the Agg canvas (no pyplot state, no
display needed), so plotting works in CI and on a headless GPU node.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both lower cost and higher quality, by cost."""
    front, best = [], -np.inf
    for cost, quality in sorted(points, key=lambda p: (p[0], -p[1])):
        if quality > best:
            front.append((cost, quality))
            best = quality
    return front


def quality_vs_cost(task_report: dict, path: Path, measure: str | None = None) -> Path:
    """Quality against scored tokens per query (log x), one point per system, Pareto front drawn."""
    from matplotlib.figure import Figure  # the eval extra's: imported when drawing, so `keyrank eval --help` needs none

    measure = measure or task_report["measures"][0]
    fig = Figure(figsize=(7, 4.5), dpi=120)
    ax = fig.add_subplot()
    chance = task_report["random"]["metrics"][measure]
    ax.axhline(chance, color="grey", linestyle=":", linewidth=1)
    ax.annotate(f"random ({chance:.3f})", (0.01, chance), xycoords=("axes fraction", "data"),
                fontsize=8, color="grey", va="bottom")
    points = []
    for name, s in task_report["systems"].items():
        quality, tokens = s["metrics"][measure], s["cost"]["scored_tokens"]
        if tokens <= 0:
            continue
        points.append((tokens, quality))
        marker = "s" if name.rpartition(":")[2].startswith("keyb2") else "o"  # compare --plot: label:system
        ax.scatter([tokens], [quality], marker=marker, s=36, zorder=3)
        ax.annotate(name, (tokens, quality), textcoords="offset points", xytext=(4, 4), fontsize=8)
    front = pareto_front(points)
    if len(front) > 1:
        ax.plot(*zip(*front), color="black", linewidth=0.8, linestyle="--", label="Pareto front")
        ax.legend(fontsize=8, loc="lower right")
    if points:
        ax.set_xscale("log")
    ax.set_xlabel("cross-encoder tokens scored per query (log)")
    ax.set_ylabel(measure)
    ax.set_title(f"{task_report['task']}: quality vs cost ({task_report['queries']} queries)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return Path(path)


def block_positions(task_report: dict, path: Path) -> Path | None:
    """Histogram of where returned evidence (keyb2 blocks, maxp windows) starts, relative to document length."""
    systems = {n: s["positions"] for n, s in task_report["systems"].items() if s.get("positions")}
    if not systems:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4), dpi=120)
    axes = fig.subplots(1, 2, sharex=True)
    for ax, which in zip(axes, ("all", "relevant")):
        for name, pos in systems.items():
            counts = np.asarray(pos[which], dtype=float)
            edges = np.asarray(pos["edges"])
            if counts.sum() == 0:
                continue
            centers = (edges[:-1] + edges[1:]) / 2
            ax.plot(centers, counts / counts.sum(), marker=".", label=name)
        ax.set_title(f"{which} documents")
        ax.set_xlabel("start of selected span / document length")
        ax.set_ylabel("share of selected spans")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{task_report['task']}: positions of selected evidence")
    fig.tight_layout()
    fig.savefig(path)
    return Path(path)


def write_all(reports: dict[str, dict], out_dir: Path) -> list[Path]:
    """Both figures for every task; returns the files written."""
    out = []
    for task, report in reports.items():
        out.append(quality_vs_cost(report, Path(out_dir) / f"{task}_quality_vs_cost.png"))
        hist = block_positions(report, Path(out_dir) / f"{task}_block_positions.png")
        if hist:
            out.append(hist)
    return out
