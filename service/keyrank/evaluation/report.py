"""Score runs: quality (ir-measures), position sensitivity, cost, evidence.

Ranking metrics are computed by ``ir-measures`` (the pytrec_eval
implementations TREC uses), never by hand; this module only averages them
per position bucket and puts them next to the cost of getting them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from keyrank.data.queries import EvalQuery, query_rng
from keyrank.data.runs import MEASURES, QueryRun, per_query

STAGES = ("tokenize", "segment", "select", "assemble", "infer", "aggregate", "total")
"""Per-stage timings the reranker reports."""
POSITION_BINS = 20
"""Bins of the relative-position histogram of selected blocks (KeyB2 Figure 10)."""
RANDOM_DRAWS = 20
"""Random orderings averaged for the chance level (one draw is too noisy on a small sample)."""
PSI_RESAMPLES = 2000
"""Bootstrap resamples and bucket shuffles behind PSI's interval and its position-blind level."""


def random_level(queries: Sequence[EvalQuery], measures: Sequence[str] = MEASURES, *, seed: int = 0,
                 draws: int = RANDOM_DRAWS) -> dict:
    """Expected metrics of a random ordering, overall and per bucket: the level FirstP falls to when blind."""
    runs = []
    for draw in range(draws):
        run = []
        for q in queries:
            rng = query_rng(seed + draw, f"{q.qid}/random")
            run.append(QueryRun(qid=q.qid, system="random", scores={c.doc_id: rng.random() for c in q.candidates}))
        runs.append(run)
    values = [per_query(queries, run, measures) for run in runs]
    mean = lambda qs, m: float(np.mean([v[q.qid][m] for v in values for q in qs]))
    buckets = sorted({q.bucket for q in queries}, key=bucket_order)
    return {
        "metrics": {m: mean(queries, m) for m in measures},
        "by_bucket": {b: {m: mean([q for q in queries if q.bucket == b], m) for m in measures} for b in buckets},
    }


def bucket_order(bucket: str) -> tuple[float, str]:
    """Buckets sort by their leading number ('0-100' < '100-200' < '500+'); named ones last."""
    match = re.match(r"\d+", bucket)
    return (float(match.group()) if match else math.inf, bucket)


def psi(by_bucket: dict[str, float]) -> float | None:
    """Position sensitivity index: 1 - min/max of a metric over position buckets (0 = position-blind)."""
    values = list(by_bucket.values())
    if len(values) < 2:
        return None
    top = max(values)
    return 0.0 if top == 0 else 1.0 - min(values) / top


def psi_uncertainty(queries: Sequence[EvalQuery], values: dict[str, dict[str, float]], measure: str, *,
                    seed: int = 0, resamples: int = PSI_RESAMPLES) -> dict | None:
    """How much of a PSI is noise, where every bucket holds the same material (far-relevant).

    Rankings are grouped by (topic, construction), one per bucket: the same
    inserts and filler, moved. ``interval``: PSI's 2.5 / 97.5 percentiles with
    topics resampled (their constructions together). ``blind``: PSI of a
    position-blind system with this noise, the buckets shuffled within each
    group (a permutation test); its median and 95th percentile, and ``p``, the
    share of shuffles at or above the observed PSI. None when the queries are
    not grouped by topic or a group lacks a bucket."""
    buckets = sorted({q.bucket for q in queries}, key=bucket_order)
    if len(buckets) < 2 or any("topic" not in q.meta for q in queries):
        return None
    groups: dict[tuple, dict[str, float]] = {}
    for q in queries:
        groups.setdefault((q.meta["topic"], q.meta.get("construction", 0)), {})[q.bucket] = values[q.qid][measure]
    if any(len(g) != len(buckets) for g in groups.values()):
        return None
    keys = sorted(groups)
    table = np.array([[groups[k][b] for b in buckets] for k in keys])
    topics = sorted({k[0] for k in keys})
    rows_of = [np.array([i for i, k in enumerate(keys) if k[0] == t]) for t in topics]

    def index(means: np.ndarray) -> float:
        return psi(dict(enumerate(means.tolist())))

    rng = np.random.default_rng(seed)
    observed = index(table.mean(axis=0))
    boot = [index(table[np.concatenate([rows_of[t] for t in rng.integers(0, len(topics), len(topics))])].mean(axis=0))
            for _ in range(resamples)]
    blind = np.array([index(rng.permuted(table, axis=1).mean(axis=0)) for _ in range(resamples)])
    low, high = np.percentile(boot, [2.5, 97.5])
    return {"psi": observed, "interval": [float(low), float(high)], "blind_median": float(np.median(blind)),
            "blind_95": float(np.percentile(blind, 95)), "p": float(np.mean(blind >= observed - 1e-12)),
            "groups": len(keys), "topics": len(topics)}


def covered_share(evidence: Sequence[tuple[int, int]], returned: Sequence[tuple[int, ...]]) -> float:
    """Share of the evidence characters that fall inside the returned spans."""
    total = np.zeros(max([e for _, e in evidence] + [0]), dtype=bool)
    for start, end in evidence:
        total[start:end] = True
    inside = np.zeros_like(total)
    for span in returned:
        inside[span[0]:span[1]] = True
    return float((total & inside).sum() / total.sum()) if total.any() else 0.0


def evidence_stats(queries: Sequence[EvalQuery], runs: Sequence[QueryRun]) -> dict | None:
    """Evidence recall over the relevant candidates: mean covered share, and share with any overlap.

    None for systems that return no evidence (firstp, sump, parade...)."""
    by_qid = {r.qid: r for r in runs}
    if not any(r.evidence and any(r.evidence.values()) for r in runs):
        return None
    shares = []
    for q in queries:
        run = by_qid.get(q.qid)
        for cand in q.candidates:
            if cand.evidence and q.qrels.get(cand.doc_id, 0) > 0:
                returned = run.evidence.get(cand.doc_id, []) if run else []
                shares.append(covered_share(cand.evidence, returned))
    if not shares:
        return None
    return {"recall": float(np.mean(shares)), "hit": float(np.mean([s > 0 for s in shares])), "documents": len(shares)}


def block_positions(queries: Sequence[EvalQuery], runs: Sequence[QueryRun]) -> dict | None:
    """Where returned evidence starts, as a share of the document length (histogram counts).

    ``all``: every candidate; ``relevant``: judged relevant candidates only."""
    by_qid = {q.qid: q for q in queries}
    positions: dict[str, list[float]] = {"all": [], "relevant": []}
    block_index: list[int] = []
    for run in runs:
        q = by_qid[run.qid]
        texts = {c.doc_id: c.text for c in q.candidates}
        for doc_id, spans in run.evidence.items():
            for start, _end, block in spans:
                rel = start / max(len(texts[doc_id]), 1)
                positions["all"].append(rel)
                if q.qrels.get(doc_id, 0) > 0:
                    positions["relevant"].append(rel)
                if block is not None:
                    block_index.append(int(block))
    if not positions["all"]:
        return None
    edges = np.linspace(0.0, 1.0, POSITION_BINS + 1)
    return {
        "edges": edges.tolist(),
        **{k: np.histogram(np.clip(v, 0, 1), bins=edges)[0].tolist() for k, v in positions.items()},
        "block_index": np.bincount(block_index).tolist() if block_index else [],
    }


def cost(runs: Sequence[QueryRun], n_candidates: float) -> dict:
    """Mean per query of what the model was asked to read and how long it took, by stage."""
    ok = [r for r in runs if not r.error]
    mean = lambda xs: float(np.mean(xs)) if xs else 0.0
    return {
        "scored_sequences": mean([r.scored_sequences for r in ok]),
        "sequences_per_document": mean([r.scored_sequences for r in ok]) / max(n_candidates, 1),
        "scored_tokens": mean([r.scored_tokens for r in ok]),
        "document_tokens": mean([r.document_tokens for r in ok]),
        "truncated_documents": mean([r.truncated_documents for r in ok]),
        "wall_ms": mean([r.wall_ms for r in ok]),
        "stage_ms": {s: mean([r.timings_ms.get(s, 0.0) for r in ok]) for s in STAGES},
    }


def summarize_system(queries: Sequence[EvalQuery], runs: Sequence[QueryRun],
                     measures: Sequence[str] = MEASURES) -> dict:
    """Everything the table and the plots need about one system on one task."""
    values = per_query(queries, runs, measures)
    buckets = sorted({q.bucket for q in queries}, key=bucket_order)
    by_bucket = {
        b: {m: float(np.mean([values[q.qid][m] for q in queries if q.bucket == b])) for m in measures}
        for b in buckets
    }
    return {
        "queries": len(queries),
        "errors": sum(1 for r in runs if r.error),
        "first_error": next((r.error for r in runs if r.error), None),
        "metrics": {m: float(np.mean([values[q.qid][m] for q in queries])) for m in measures},
        "by_bucket": by_bucket,
        "psi": {m: psi({b: by_bucket[b][m] for b in buckets}) for m in measures},
        "psi_noise": psi_uncertainty(queries, values, measures[0]),
        "cost": cost(runs, float(np.mean([len(q.candidates) for q in queries]))),
        "evidence": evidence_stats(queries, runs),
        "positions": block_positions(queries, runs),
        "per_query": values,
    }


def summarize(task: str, queries: Sequence[EvalQuery], runs: dict[str, list[QueryRun]],
              measures: Sequence[str] = MEASURES, *, seed: int = 0, skipped: dict[str, str] | None = None) -> dict:
    """One task's report: the construction's size, what it left out (``skipped``: {id: why}, e.g. a
    far-relevant topic without filler) and every system's summary."""
    return {
        "task": task,
        "queries": len(queries),
        "skipped": dict(skipped or {}),
        "candidates_per_query": float(np.mean([len(q.candidates) for q in queries])),
        "buckets": {b: sum(q.bucket == b for q in queries)
                    for b in sorted({q.bucket for q in queries}, key=bucket_order)},
        "measures": list(measures),
        "random": random_level(queries, measures, seed=seed),
        "systems": {name: summarize_system(queries, system_runs, measures) for name, system_runs in runs.items()},
    }


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(task_report: dict) -> str:
    """The task's results as markdown: the main table, then quality per position bucket."""
    measures = task_report["measures"]
    head = measures + [f"PSI({measures[0]})", "seq/query", "seq/doc", "tokens/query", "ms/query",
                       "infer ms", "evidence recall", "errors"]
    lines = [
        f"### {task_report['task']}",
        "",
        f"{task_report['queries']} queries, {task_report['candidates_per_query']:.1f} candidates per query; "
        f"buckets: " + ", ".join(f"{b} ({n})" for b, n in task_report["buckets"].items()),
        "",
        *left_out(task_report.get("skipped", {})),
        "| system | " + " | ".join(head) + " |",
        "|---" * (len(head) + 1) + "|",
    ]
    rnd = task_report["random"]
    lines.append("| random (expected) | " + " | ".join(_fmt(rnd["metrics"][m]) for m in measures)
                 + " |" + " - |" * (len(head) - len(measures)))
    for name, s in task_report["systems"].items():
        c, ev = s["cost"], s["evidence"]
        row = [_fmt(s["metrics"][m]) for m in measures] + [
            _fmt(s["psi"][measures[0]]), _fmt(c["scored_sequences"], 1), _fmt(c["sequences_per_document"], 2),
            _fmt(c["scored_tokens"], 0), _fmt(c["wall_ms"], 1), _fmt(c["stage_ms"]["infer"], 1),
            _fmt(ev["recall"]) if ev else "-", str(s["errors"]),
        ]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    buckets = list(task_report["buckets"])
    if len(buckets) > 1:
        lines += ["", f"{measures[0]} per position bucket:", "",
                  "| system | " + " | ".join(buckets) + " |", "|---" * (len(buckets) + 1) + "|",
                  "| random (expected) | " + " | ".join(_fmt(rnd["by_bucket"][b][measures[0]]) for b in buckets) + " |"]
        for name, s in task_report["systems"].items():
            lines.append(f"| {name} | " + " | ".join(_fmt(s["by_bucket"][b][measures[0]]) for b in buckets) + " |")
        noise = [psi_line(name, s["psi_noise"], measures[0]) for name, s in task_report["systems"].items() if s.get("psi_noise")]
        if noise:
            lines += ["", *noise]
    return "\n".join(lines) + "\n"


def left_out(skipped: dict[str, str]) -> list[str]:
    """The report's lines on what the task left out: one per reason, naming the ids, then a blank line."""
    reasons: dict[str, list[str]] = {}
    for qid, why in skipped.items():
        reasons.setdefault(why, []).append(qid)
    return [f"Left out ({len(ids)}): {', '.join(ids)}: {why}." for why, ids in reasons.items()] + ([""] if reasons else [])


def psi_line(system: str, noise: dict, measure: str) -> str:
    """One sentence on how far a PSI stands above what noise alone gives (psi_uncertainty)."""
    return (f"- {system}: PSI({measure}) {noise['psi']:.3f}, 95% interval [{noise['interval'][0]:.3f}, "
            f"{noise['interval'][1]:.3f}] over {noise['topics']} topics; a position-blind system with this noise "
            f"scores {noise['blind_median']:.3f} (median), <= {noise['blind_95']:.3f} in 95% of bucket shuffles; "
            f"p = {noise['p']:.3f}")


def write(out_dir: Path, reports: dict[str, dict], runs: dict[str, dict[str, list[QueryRun]]],
          header: str = "") -> Path:
    """report.md, results.json (summaries) and runs/<task>.json (raw per-query runs) under ``out_dir``."""
    out_dir = Path(out_dir)
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    summaries = {t: {**r, "systems": {n: {k: v for k, v in s.items() if k != "per_query"}
                                       for n, s in r["systems"].items()}} for t, r in reports.items()}
    (out_dir / "results.json").write_text(json.dumps(summaries, indent=2))
    for task, task_runs in runs.items():
        per_query_values = {n: s["per_query"] for n, s in reports[task]["systems"].items()}
        (out_dir / "runs" / f"{task}.json").write_text(json.dumps({
            "per_query": per_query_values,
            "runs": {n: [r.to_json() for r in rs] for n, rs in task_runs.items()},
        }))
    md = out_dir / "report.md"
    md.write_text(header + "\n".join(markdown(r) for r in reports.values()))
    return md
