"""The tokenize stage on its plain-ASCII path (no normalizer, offsets computed from the ids) against the tokenizer's
own normalizer and offsets (docs/PERFORMANCE.md, section 2), in one run.

    .venv/bin/python docs/experiments/tokenize_offsets.py [--rounds 7]

One cold request (document cache off) of 100 QMSum candidates of ~2k tokens, planned in process per strategy;
the two ways alternate round by round, and each row is the median over rounds of the per-stage milliseconds.
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, "service")

from keyrank.bench.workloads import candidate_documents  # noqa: E402
from keyrank.config import get_settings  # noqa: E402
from keyrank.pipeline import Pipeline, RerankOptions, StageTimer  # noqa: E402

STRATEGIES = (("keyb2-blocks", "bm25"), ("keyb2", "bm25"), ("maxp", None), ("firstp", None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", type=Path, default=Path("models"))
    args = parser.parse_args()
    pipeline = Pipeline.from_model_dir(get_settings().with_overrides(model_dir=args.models, document_cache_bytes=0))
    tokenizer = pipeline.tokenizer
    computed = tokenizer._plain_tok
    if computed is None:
        sys.exit("this tokenizer has no plain-ASCII path (not BERT WordPiece): nothing to compare")
    pool, queries = candidate_documents(Path("../shared/datasets"), tokenizer, 100)
    tokens = sum(len(d) for d in pipeline.encode(queries[0], pool)[1])
    print(f"{len(pool)} documents, {tokens:,} tokens, {sum(t.isascii() for t in pool)} of them ASCII; median of {args.rounds} rounds")
    print(f"{'strategy':<18}{'offsets':<12}{'tokenize ms':>12}{'total ms':>10}{'M tokens/s':>12}")
    for strategy, selector in STRATEGIES:
        options = RerankOptions(strategy=strategy, selector=selector)
        pipeline.plan(queries[0], pool, options)  # warm: selectors built, numba compiled
        stages: dict[str, list[dict]] = {"tokenizer": [], "computed": []}
        for _ in range(args.rounds):
            for way, table in (("tokenizer", None), ("computed", computed)):
                tokenizer._plain_tok = table
                timer = StageTimer()
                pipeline.plan(queries[0], pool, options, timer=timer)
                stages[way].append(timer.total())
        tokenizer._plain_tok = computed
        totals = {}
        for way, rows in stages.items():
            tok = statistics.median(r["tokenize"] for r in rows)
            totals[way] = statistics.median(r["total"] for r in rows)
            print(f"{strategy:<18}{way:<12}{tok:>12.1f}{totals[way]:>10.1f}{tokens / totals[way] / 1e3:>12.2f}")
        print(f"{'':<18}{'ratio':<12}{'':>12}{totals['tokenizer'] / totals['computed']:>9.2f}x")


if __name__ == "__main__":
    main()
