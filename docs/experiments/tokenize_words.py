"""The tokenize stage's plain-ASCII ids from the word cache (tokenize.WordPieces) against the tokenizer's Rust
batch (docs/PERFORMANCE.md, section 2), in one run: wall and CPU time of the whole cold plan.

    .venv/bin/python docs/experiments/tokenize_words.py [--rounds 7]

One cold request (document cache off) of 100 QMSum candidates of ~2k tokens, planned in process per strategy; the
ways alternate round by round: the Rust batch (over all cores), the word cache as it stands after the first round,
and the word cache emptied before every round (a request whose every word is new). Medians over rounds. Then the
ids alone, the same lowercased texts: ``WordPieces.encode`` per text against one ``encode_batch_fast``.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", type=Path, default=Path("models"))
    args = parser.parse_args()
    settings = get_settings().with_overrides(model_dir=args.models, document_cache_bytes=0, tokenize_word_cache="on")
    pipeline = Pipeline.from_model_dir(settings)
    tokenizer = pipeline.tokenizer
    words = tokenizer.words
    if words is None:
        sys.exit("this tokenizer has no plain-ASCII path (not BERT WordPiece): nothing to compare")
    pool, queries = candidate_documents(Path("../shared/datasets"), tokenizer, 100)
    tokens = sum(len(d) for d in pipeline.encode(queries[0], pool)[1])
    print(f"{len(pool)} documents, {tokens:,} tokens, {len(words):,} distinct chunks; median of {args.rounds} rounds")
    print(f"{'strategy':<14}{'ids from':<16}{'tokenize ms':>12}{'total ms':>10}{'CPU ms':>8}")
    for strategy, selector in STRATEGIES:
        options = RerankOptions(strategy=strategy, selector=selector)
        pipeline.plan(queries[0], pool, options)  # warm: selectors built, numba compiled
        rows: dict[str, list[tuple[dict, float]]] = {"rust batch": [], "word cache": [], "new words": []}
        for _ in range(args.rounds):
            for way in rows:
                tokenizer.words = None if way == "rust batch" else words
                if way == "new words":
                    words._pieces = {}
                timer, cpu = StageTimer(), time.process_time()
                pipeline.plan(queries[0], pool, options, timer=timer)
                rows[way].append((timer.total(), (time.process_time() - cpu) * 1e3))
        tokenizer.words = words
        for way, measured in rows.items():
            tok = statistics.median(r["tokenize"] for r, _ in measured)
            total = statistics.median(r["total"] for r, _ in measured)
            cpu = statistics.median(c for _, c in measured)
            print(f"{strategy:<14}{way:<16}{tok:>12.1f}{total:>10.1f}{cpu:>8.1f}")
    lowered = [text.lower() for text in pool]
    ways = {"rust batch": lambda: tokenizer._plain_tok.encode_batch_fast(lowered, add_special_tokens=False),
            "word cache": lambda: [words.encode(text) for text in lowered]}
    ids: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
    for _ in range(args.rounds):
        for way, run in ways.items():
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            ids[way].append(((time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3))
    for way, measured in ids.items():
        print(f"ids alone, {way}: {statistics.median(w for w, _ in measured):.1f} ms wall, "
              f"{statistics.median(c for _, c in measured):.1f} ms CPU")


if __name__ == "__main__":
    main()
