"""``keyrank eval``: build the tasks, run the strategies through the real Reranker, write the report.

    keyrank eval --task all --split val --max-queries 60 --seed 0 --out runs/cpu-small

Without ``--triton-url`` an embedded CPU Triton is started on the prepared
``--model-dir`` (the same one ``keyrank serve`` uses).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from keyrank.cli_format import DefaultsHelpFormatter
from keyrank.config import SELECTORS, STRATEGIES, Settings
from keyrank.data import farrelevant, qmsum
from keyrank.data.judged import add_trec_arguments, trec_files
from keyrank.evaluation import plots, report, tasks
from keyrank.evaluation.memo import MemoScorer
from keyrank.evaluation.runner import run_task, systems
from keyrank.tokenize import TextTokenizer

def _names(values: list[str], allowed: Sequence[str], what: str) -> list[str]:
    """Comma- or space-separated names, validated, order kept."""
    names = [n for v in values for n in v.split(",") if n]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise SystemExit(f"unknown {what} {unknown}; choose from {', '.join(allowed)}")
    return names


def scored_by(args: argparse.Namespace, settings: Settings) -> str:
    """What scored the sequences, for the report's header."""
    from keyrank.prepare.variants import served_variant

    if args.scorer == "local":
        return f"the {served_variant(settings.model_dir)} CPU model in-process (--scorer local)"
    if settings.triton_url:
        return f"Triton {settings.triton_url}"
    return f"the embedded Triton (CPU, its {served_variant(settings.model_dir)} model)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="keyrank eval", description=__doc__.split("\n\n")[0], formatter_class=DefaultsHelpFormatter)
    p.add_argument("--task", nargs="+", default=["all"],
                   help="qmsum | farrel (with its farrel-bare ceiling) | squad | all (the shipped data) | trec (your files: --qrels --docs --queries)")
    p.add_argument("--split", default="val", help="QMSum split: val for reported numbers, train for development, train-dev for the train meetings finetune never trains on")
    p.add_argument("--strategies", nargs="+", default=[",".join(STRATEGIES)], help=f"subset of {', '.join(STRATEGIES)}")
    p.add_argument("--selectors", nargs="+", default=[",".join(SELECTORS)], help=f"keyb2 selectors: {', '.join(SELECTORS)}")
    p.add_argument("--max-queries", type=int, default=None, help="per task, stratified by position bucket (far-relevant: topics x offsets); None = all")
    p.add_argument("--seed", type=int, default=0, help="constructions and sub-sampling are deterministic given it")
    p.add_argument("--out", type=Path, default=None, help="output folder; None = runs/eval-<time>")
    p.add_argument("--data-dir", type=Path, default=Settings().eval_data_dir,
                   help="folder of qmsum/, trec-dl20-passage/, squad2-dev-half/ (KEYRANK_EVAL_DATA_DIR)")
    p.add_argument("--model-dir", type=Path, default=None, help="output of `keyrank prepare`; None = KEYRANK_MODEL_DIR (models)")
    p.add_argument("--triton-url", default=None, help="host:port of a running Triton (gRPC); unset = embedded CPU Triton")
    p.add_argument("--scorer", choices=("triton", "local"), default="triton",
                   help="triton: the service's path (embedded or --triton-url); local: the same CPU model in-process (same scores, tested)")
    p.add_argument("--no-memo", action="store_true",
                   help="score every sequence every time (else each distinct sequence once per run; wall times then "
                        "favour systems that reuse another's windows, scored tokens do not change)")
    p.add_argument("--concurrency", type=int, default=1, help="queries in flight; 1 keeps per-query latency free of queueing")
    p.add_argument("--timeout-s", type=float, default=600.0, help="deadline per ranking request")
    p.add_argument("--segment-tokens", type=int, default=qmsum.SEGMENT_TOKENS, help="QMSum segment size")
    p.add_argument("--offsets", default=",".join(map(str, farrelevant.OFFSETS)), help="far-relevant insertion offsets (tokens)")
    p.add_argument("--distractors", type=int, default=farrelevant.DISTRACTORS, help="far-relevant filler-only documents per ranking")
    p.add_argument("--filler", choices=farrelevant.FILLERS, default="other-topics",
                   help="far-relevant filler: other queries' non-relevant passages, or the query's own (hard variant)")
    p.add_argument("--constructions", type=int, default=1,
                   help="far-relevant: draws of inserts and filler per topic (seeds --seed, --seed+1, ...); "
                        "5 gives 135 rankings per offset on the held-back topics instead of 27")
    p.add_argument("--dl20-topics", choices=("held-back", "train", "all"), default="held-back",
                   help="far-relevant topics: the ones finetune never trains on (reported), its training ones, or all")
    add_trec_arguments(p, lead="trec task: ")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _checkpoint_key(args, settings: Settings, manifest: dict, task_queries) -> str:
    """What a saved system's runs depend on: the model, every setting, the scorer and the queries."""
    state = json.dumps({"manifest": manifest, "settings": settings.model_dump(mode="json"), "scorer": args.scorer,
                        "timeout_s": args.timeout_s,
                        "queries": [(q.qid, q.query) for q in task_queries]}, sort_keys=True)
    digest = hashlib.sha256(state.encode())
    for q in task_queries:
        for c in q.candidates:
            digest.update(f"{c.doc_id}\0{c.text}\0".encode())
    return digest.hexdigest()


async def _run(args, settings: Settings, queries: dict, systems_, out: Path) -> dict:
    """Start (or reach) Triton once and run every task."""
    from keyrank.reranker import Reranker

    runs: dict = {}
    reranker = None
    if systems_:
        if args.scorer == "local":
            reranker = await asyncio.to_thread(Reranker.local, None, settings)
        else:
            reranker = Reranker(settings) if settings.triton_url else await asyncio.to_thread(Reranker.embedded, settings)
        if not args.no_memo:
            reranker.scorer = MemoScorer(reranker.scorer)
    manifest = reranker.pipeline.manifest if reranker is not None else {}
    try:
        for task, task_queries in queries.items():
            runs[task] = await run_task(reranker, systems_, task_queries, task=task, concurrency=args.concurrency, timeout_s=args.timeout_s,
                                        progress=not args.no_progress, checkpoints=out / "partial",
                                        key=_checkpoint_key(args, settings, manifest, task_queries))
        if isinstance(getattr(reranker, "scorer", None), MemoScorer):
            print(f"memo: {reranker.scorer.misses} sequences scored, {reranker.scorer.hits} answered from memory", file=sys.stderr)
    finally:
        if reranker is not None:
            await reranker.aclose()
            await asyncio.to_thread(reranker.close)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        task_names = tasks.expand([n for v in args.task for n in v.split(",") if n])
    except ValueError as exc:
        raise SystemExit(f"keyrank eval: {exc}") from None
    strategies = _names(args.strategies, STRATEGIES, "strategies")
    selectors = _names(args.selectors, SELECTORS, "selectors")
    systems_ = systems(strategies, selectors)
    overrides = {k: v for k, v in {"model_dir": args.model_dir, "triton_url": args.triton_url}.items() if v is not None}
    # Port 0 = any free port: an offline eval must not collide with a `keyrank serve` on the defaults.
    settings = Settings(**overrides, embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    out = args.out or Path("runs") / time.strftime("eval-%Y%m%d-%H%M%S")
    tokenizer_path = settings.gateway_dir / "tokenizer.json"
    if not tokenizer_path.exists():
        raise SystemExit(f"{tokenizer_path} not found: run `keyrank prepare` first (or pass --model-dir)")
    tokenizer = TextTokenizer.from_file(tokenizer_path)
    offsets = tuple(int(o) for o in args.offsets.split(","))
    trec = trec_files(args, "keyrank eval --task trec") if "trec" in task_names else None
    if "trec" in task_names and trec is None:
        raise SystemExit("keyrank eval --task trec reads your TREC files: give --qrels, --docs and --queries together")

    started = time.perf_counter()
    skipped: dict[str, dict[str, str]] = {t: {} for t in task_names}  # e.g. far-relevant topics without filler
    try:
        queries = {
            t: tasks.build(t, args.data_dir, tokenizer, split=args.split, seed=args.seed, max_queries=args.max_queries,
                           segment_tokens=args.segment_tokens, offsets=offsets, distractors=args.distractors,
                           filler=args.filler, dl20_topics=args.dl20_topics, trec=trec,
                           constructions=args.constructions, skipped=skipped[t])
            for t in task_names
        }
    except ValueError as exc:
        raise SystemExit(f"keyrank eval: {exc}") from None
    build_s = time.perf_counter() - started
    for t, qs in queries.items():
        print(f"{t}: {len(qs)} queries, {sum(len(q.candidates) for q in qs)} candidates", file=sys.stderr)

    started = time.perf_counter()
    runs = asyncio.run(_run(args, settings, queries, systems_, Path(out)))
    run_s = time.perf_counter() - started

    reports = {t: report.summarize(t, queries[t], runs[t], seed=args.seed, skipped=skipped[t]) for t in task_names}
    command = "keyrank eval " + " ".join(argv if argv is not None else sys.argv[1:])
    header = (f"# keyrank eval\n\n`{command}`\n\nseed {args.seed}, split {args.split}, "
              f"{platform.node()} ({platform.processor() or platform.machine()}), scored by {scored_by(args, settings)}; "
              f"built in {build_s:.1f} s, ran in {run_s:.1f} s\n\n")
    md = report.write(out, reports, runs, header=header)
    (Path(out) / "config.json").write_text(json.dumps({
        "command": command, "seed": args.seed, "split": args.split, "tasks": task_names,
        "systems": [s.name for s in systems_], "max_queries": args.max_queries,
        "segment_tokens": args.segment_tokens, "offsets": offsets, "distractors": args.distractors, "filler": args.filler, "dl20_topics": args.dl20_topics,
        "constructions": args.constructions,
        "concurrency": args.concurrency, "model_dir": str(settings.model_dir), "scorer": args.scorer, "memo": not args.no_memo,
        "triton_url": settings.triton_url, "build_s": build_s, "run_s": run_s,
    }, indent=2))
    figures = plots.write_all(reports, out)
    print(md.read_text())
    print(f"wrote {md}, {Path(out) / 'results.json'}, " + ", ".join(str(f) for f in figures), file=sys.stderr)
    return 0
