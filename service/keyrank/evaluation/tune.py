"""keyrank tune: choose the strategy, selector, keyb2 settings and window cap on your own judged queries.

    keyrank tune --qrels dev.qrels --docs docs.jsonl --queries dev.tsv [--run first-stage.run] --out tune

Every candidate system ranks the dev queries through the real ``Reranker`` (the served model in
``--model-dir``, its CPU variant in-process by default, the same scores as Triton). Quality is
nDCG@10 (ir-measures), cost is the tokens the cross-encoder reads per query. The winner is the
cheapest system that is not measurably worse than the best one: its paired nDCG@10 difference to
the best (95% bootstrap interval over queries) reaches 0; ``--prefer quality`` takes the best
outright. Written to ``--out``: ``report.md`` (the table, the intervals, the rule), ``results.json``
and ``keyrank.env``, the winner's ``KEYRANK_*`` settings, which ``keyrank serve`` reads with
``KEYRANK_ENV_FILE=tune/keyrank.env`` (docker ``--env-file`` and compose ``env_file:`` read it as is).

Tune on dev queries, never on the queries you report: the choice is fitted to them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from keyrank.config import SELECTORS, STRATEGIES, Settings
from keyrank.data.judged import add_trec_arguments, trec_files
from keyrank.data.queries import EvalQuery
from keyrank.data.runs import per_query
from keyrank.evaluation import tasks
from keyrank.evaluation.compare import paired_difference
from keyrank.evaluation.memo import MemoScorer
from keyrank.evaluation.runner import System, run_system
from keyrank.strategies import REGISTRY
from keyrank.strategies.cuts import BLOCKS

MEASURE = "nDCG@10"
KEYB2_VARIANTS = ("", "keyb2_min_score_share=0", "keyb2_budget=fill", "keyb2_passes=2")
"""keyb2 settings tried by default beside the defaults: the papers' full budget (no adaptive share),
every token that fits next to the query, and a second reading of the next-best blocks. More with
``--keyb2``."""
WINDOW_VARIANTS = ("", "max_windows_per_doc=3")
"""Settings the windows strategies are tried with: every window (up to the service's cap), and the 3 best
windows of a document by BM25 (``window_cap_by``), which on dev cost maxp half its tokens on meetings and
a quarter on far-relevant documents for no measurable loss (docs/EXPERIMENTS.md, 2026-11-27). More with
``--windows``; scored windows are shared (memoised), so a capped variant costs little to try."""


@dataclass(frozen=True)
class Candidate:
    """One system under test: a strategy (+ selector) and the settings it is served with."""

    strategy: str
    selector: str | None = None
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        base = f"{self.strategy}-{self.selector}" if self.selector else self.strategy
        return base + "".join(f" {k}={v}" for k, v in sorted(self.settings.items()))

    def env(self) -> dict[str, str]:
        """The ``KEYRANK_*`` lines that serve this system by default."""
        lines = {"KEYRANK_DEFAULT_STRATEGY": self.strategy}
        if self.selector:
            lines["KEYRANK_DEFAULT_SELECTOR"] = self.selector
        lines.update({f"KEYRANK_{k.upper()}": v for k, v in sorted(self.settings.items())})
        return lines


def parse_variant(text: str, option: str = "--keyb2") -> dict[str, str]:
    """``"keyb2_budget=fill,keyb2_min_score_share=0"`` as a dict; names are checked against Settings."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name not in Settings.model_fields:
            raise SystemExit(f"{option} {text!r}: give name=value pairs of settings (e.g. keyb2_budget=fill); "
                             f"{name!r} is not a setting")
        out[name] = value
    return out


def candidates(strategies: Sequence[str], selectors: Sequence[str], variants: Sequence[str],
               window_variants: Sequence[str] = ("",)) -> list[Candidate]:
    """Each strategy once; keyb2 once per selector and settings variant; a windows strategy once per
    ``window_variants`` entry."""
    out = []
    for strategy in strategies:
        if REGISTRY[strategy].needs_selector:  # the keyb2 variants shape keyb2's reading; keyb2-blocks reads blocks alone
            tried = variants if REGISTRY[strategy].cut is BLOCKS else [""]
            out += [Candidate(strategy, s, parse_variant(v, "--keyb2")) for s in selectors for v in tried]
        elif REGISTRY[strategy].windowed:
            out += [Candidate(strategy, None, parse_variant(v, "--windows")) for v in window_variants]
        else:
            out.append(Candidate(strategy))
    return out


def choose(per_query_scores: dict[str, dict[str, float]], cost: dict[str, float], *, prefer: str = "cost",
           seed: int = 0) -> tuple[str, dict[str, tuple[float, float, float, int]]]:
    """(winner, {system: paired difference to the best}). The best is the highest mean; with
    ``prefer="cost"`` the winner is the cheapest system whose interval to the best reaches 0."""
    means = {s: sum(v.values()) / len(v) for s, v in per_query_scores.items()}
    best = max(means, key=lambda s: (means[s], -cost[s]))
    diffs = {s: paired_difference(per_query_scores[s], per_query_scores[best], seed=seed) for s in per_query_scores}
    if prefer == "quality":
        return best, diffs
    tied = [s for s, (_, _, high, _) in diffs.items() if high >= 0]
    return min(tied, key=lambda s: (cost[s], -means[s])), diffs


async def _rank_all(args, settings: Settings, queries: list[EvalQuery], systems_: list[Candidate]) -> dict[str, list]:
    """Every candidate through its own Reranker, all on one scorer (memoised: windows and blocks that
    two systems share are scored once)."""
    from keyrank.reranker import Reranker

    first = await asyncio.to_thread(Reranker.local, None, settings)
    scorer = MemoScorer(first.scorer)
    runs = {}
    try:
        for candidate in systems_:
            reranker = Reranker(settings.with_overrides(**candidate.settings), scorer=scorer)
            system = System(candidate.strategy, candidate.selector)
            runs[candidate.name] = await run_system(reranker, system, queries, timeout_s=args.timeout_s,
                                                    label="tune: ", progress=not args.no_progress)
    finally:
        await first.aclose()
        await asyncio.to_thread(first.close)
    return runs


def report(queries: list[EvalQuery], runs: dict[str, list], systems_: list[Candidate], *, prefer: str,
           seed: int) -> tuple[Candidate, dict]:
    """The winner and the table's rows."""
    scores = {name: {q: m[MEASURE] for q, m in per_query(queries, r, (MEASURE,)).items()} for name, r in runs.items()}
    tokens = {name: sum(x.scored_tokens for x in r) / len(r) for name, r in runs.items()}
    failed = {name: sum(1 for x in r if x.error) for name, r in runs.items()}
    winner, diffs = choose(scores, tokens, prefer=prefer, seed=seed)
    rows = {
        name: {"nDCG@10": sum(scores[name].values()) / len(scores[name]), "diff_to_best": diffs[name][0],
               "interval": [diffs[name][1], diffs[name][2]], "tokens_per_query": tokens[name], "failed_queries": failed[name]}
        for name in runs
    }
    return next(c for c in systems_ if c.name == winner), rows


def write(out: Path, winner: Candidate, rows: dict, *, command: str, n_queries: int, prefer: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"winner": winner.name, "env": winner.env(), "prefer": prefer,
                                                  "queries": n_queries, "systems": rows}, indent=2))
    env = [f"# keyrank tune: {winner.name} ({prefer}), chosen on {n_queries} queries; see report.md", f"# {command}"]
    (out / "keyrank.env").write_text("\n".join(env + [f"{k}={v}" for k, v in winner.env().items()]) + "\n")
    rule = ("the cheapest system whose paired nDCG@10 difference to the best has a 95% interval reaching 0"
            if prefer == "cost" else "the best mean nDCG@10")
    lines = [f"# keyrank tune\n\n`{command}`\n\n{n_queries} queries. Winner ({rule}): **{winner.name}**, "
             f"written to `keyrank.env`.\n",
             "| system | nDCG@10 | minus best [95% interval] | tokens/query | failed queries |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, r in sorted(rows.items(), key=lambda item: -item[1]["nDCG@10"]):
        mark = " **(chosen)**" if name == winner.name else ""
        lines.append(f"| {name}{mark} | {r['nDCG@10']:.3f} | {r['diff_to_best']:+.3f} [{r['interval'][0]:+.3f}, "
                     f"{r['interval'][1]:+.3f}] | {r['tokens_per_query']:.0f} | {r['failed_queries']} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")


def parser() -> argparse.ArgumentParser:
    from keyrank.cli_format import DefaultsHelpFormatter

    # Neither trained parts nor a long-context model (longp) can be assumed: name those with --strategies.
    runnable = [s for s in STRATEGIES if not REGISTRY[s].trained_parts and not REGISTRY[s].cut.needs]
    p = argparse.ArgumentParser(prog="keyrank tune", description=__doc__.split("\n\n")[0], formatter_class=DefaultsHelpFormatter)
    add_trec_arguments(p, required=True)
    p.add_argument("--model-dir", type=Path, default=None, help="output of `keyrank prepare`; unset = KEYRANK_MODEL_DIR (models)")
    p.add_argument("--strategies", nargs="+", default=runnable, choices=STRATEGIES, help="strategies to try")
    p.add_argument("--selectors", nargs="+", default=list(SELECTORS), choices=SELECTORS, help="keyb2 selectors to try")
    p.add_argument("--keyb2", nargs="*", default=list(KEYB2_VARIANTS), metavar="NAME=VALUE[,...]",
                   help="keyb2 settings variants to try with each selector ('' = the defaults)")
    p.add_argument("--windows", nargs="*", default=list(WINDOW_VARIANTS), metavar="NAME=VALUE[,...]",
                   help="settings variants to try with each windows strategy (maxp, sump, avgp, parade-*; '' = the defaults)")
    p.add_argument("--prefer", choices=("cost", "quality"), default="cost",
                   help="cost: the cheapest system not measurably worse than the best; quality: the best")
    p.add_argument("--timeout-s", type=float, default=600.0, help="deadline per ranking")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap intervals")
    p.add_argument("--out", type=Path, default=Path("tune"), help="output folder: report.md, results.json, keyrank.env")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = Settings(**({"model_dir": args.model_dir} if args.model_dir else {}))
    if not (settings.gateway_dir / "tokenizer.json").exists():
        raise SystemExit(f"{settings.gateway_dir / 'tokenizer.json'} not found: run `keyrank prepare` first (or pass --model-dir)")
    try:
        queries = tasks.trec_queries(trec_files(args, "keyrank tune"))
    except ValueError as exc:
        raise SystemExit(f"keyrank tune: {exc}") from None
    systems_ = candidates(args.strategies, args.selectors, args.keyb2 or [""], args.windows or [""])
    print(f"tune: {len(systems_)} systems on {len(queries)} queries", file=sys.stderr)
    runs = asyncio.run(_rank_all(args, settings, queries, systems_))
    winner, rows = report(queries, runs, systems_, prefer=args.prefer, seed=args.seed)
    command = "keyrank tune " + shlex.join(argv if argv is not None else sys.argv[1:])
    write(args.out, winner, rows, command=command, n_queries=len(queries), prefer=args.prefer)
    print((args.out / "report.md").read_text())
    print(f"wrote {args.out / 'keyrank.env'}: serve it with KEYRANK_ENV_FILE={args.out / 'keyrank.env'} keyrank serve",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
