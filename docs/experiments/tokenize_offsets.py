"""The tokenize stage on its plain-ASCII path (no normalizer, offsets computed from the ids) against the tokenizer's
own normalizer and offsets (docs/EXPERIMENTS.md, 2026-11-29), in one run.

    .venv/bin/python docs/experiments/tokenize_offsets.py [--rounds 7]

One cold request (document cache off) of 100 QMSum candidates of ~2k tokens, planned in process per strategy;
the two ways alternate round by round, and each row is the median over rounds of the per-stage milliseconds.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, "service")

from keyrank.bench.workloads import candidate_documents  # noqa: E402
from keyrank.config import get_settings  # noqa: E402
from keyrank.pipeline import Pipeline, RerankOptions, StageTimer  # noqa: E402

STRATEGIES = (("keyb2-blocks", "bm25"), ("keyb2", "bm25"), ("maxp", None), ("firstp", None))


def cold_request(doc: str, **settings) -> tuple[argparse.Namespace, Pipeline, list[str], list[str], int]:
    """The command line (--rounds, --models), a pipeline without document cache whose tokenizer has the plain-ASCII
    path, 100 QMSum candidates with their queries, and the candidates' tokens (this script's and tokenize_words.py's
    setup)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", type=Path, default=Path("models"))
    args = parser.parse_args()
    pipeline = Pipeline.from_model_dir(get_settings().with_overrides(model_dir=args.models, document_cache_bytes=0, **settings))
    if pipeline.tokenizer._plain_tok is None:
        sys.exit("this tokenizer has no plain-ASCII path (not BERT WordPiece): nothing to compare")
    pool, queries = candidate_documents(Path("../shared/datasets"), pipeline.tokenizer, 100)
    tokens = sum(len(d) for d in pipeline.encode(queries[0], pool)[1])
    return args, pipeline, pool, queries, tokens


def alternating_plans(args, pipeline: Pipeline, pool: list[str], queries: list[str], ways: dict):
    """Per strategy: (strategy, {way: [(stage ms, CPU ms) per round]}), each ``ways[way]()`` called before its plan,
    the ways alternating round by round."""
    for strategy, selector in STRATEGIES:
        options = RerankOptions(strategy=strategy, selector=selector)
        pipeline.plan(queries[0], pool, options)  # warm: selectors built, numba compiled
        rows: dict[str, list[tuple[dict, float]]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            for way, setup in ways.items():
                setup()
                timer, cpu = StageTimer(), time.process_time()
                pipeline.plan(queries[0], pool, options, timer=timer)
                rows[way].append((timer.total(), (time.process_time() - cpu) * 1e3))
        yield strategy, rows


def main() -> None:
    args, pipeline, pool, queries, tokens = cold_request(__doc__)
    tokenizer = pipeline.tokenizer
    computed = tokenizer._plain_tok
    print(f"{len(pool)} documents, {tokens:,} tokens, {sum(t.isascii() for t in pool)} of them ASCII; median of {args.rounds} rounds")
    print(f"{'strategy':<18}{'offsets':<12}{'tokenize ms':>12}{'total ms':>10}{'M tokens/s':>12}")
    ways = {"tokenizer": lambda: setattr(tokenizer, "_plain_tok", None), "computed": lambda: setattr(tokenizer, "_plain_tok", computed)}
    for strategy, stages in alternating_plans(args, pipeline, pool, queries, ways):
        totals = {}
        for way, rows in stages.items():
            tok = statistics.median(r["tokenize"] for r, _ in rows)
            totals[way] = statistics.median(r["total"] for r, _ in rows)
            print(f"{strategy:<18}{way:<12}{tok:>12.1f}{totals[way]:>10.1f}{tokens / totals[way] / 1e3:>12.2f}")
        print(f"{'':<18}{'ratio':<12}{'':>12}{totals['tokenizer'] / totals['computed']:>9.2f}x")
    tokenizer._plain_tok = computed


if __name__ == "__main__":
    main()
