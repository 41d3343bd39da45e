"""The tokenize stage's plain-ASCII ids from the word cache (tokenize.WordPieces) against the tokenizer's Rust
batch (docs/PERFORMANCE.md, section 2), in one run: wall and CPU time of the whole cold plan.

    .venv/bin/python docs/experiments/tokenize_words.py [--rounds 7]

One cold request (document cache off) of 100 QMSum candidates of ~2k tokens, planned in process per strategy; the
ways alternate round by round: the Rust batch (over all cores), the word cache as it stands after the first round,
and the word cache emptied before every round (a request whose every word is new). Medians over rounds. Then the
ids alone, the same lowercased texts: ``WordPieces.encode`` per text against one ``encode_batch_fast``.
"""

import statistics
import sys
import time

sys.path.insert(0, "service")
sys.path.insert(0, "docs/experiments")

from tokenize_offsets import alternating_plans, cold_request  # noqa: E402


def main() -> None:
    args, pipeline, pool, queries, tokens = cold_request(__doc__, tokenize_word_cache="on")
    tokenizer = pipeline.tokenizer
    words = tokenizer.words
    print(f"{len(pool)} documents, {tokens:,} tokens, {len(words):,} distinct chunks; median of {args.rounds} rounds")
    print(f"{'strategy':<14}{'ids from':<16}{'tokenize ms':>12}{'total ms':>10}{'CPU ms':>8}")

    def new_words():
        tokenizer.words = words
        words._pieces = {}

    ways = {"rust batch": lambda: setattr(tokenizer, "words", None), "word cache": lambda: setattr(tokenizer, "words", words),
            "new words": new_words}
    for strategy, rows in alternating_plans(args, pipeline, pool, queries, ways):
        for way, measured in rows.items():
            tok = statistics.median(r["tokenize"] for r, _ in measured)
            total = statistics.median(r["total"] for r, _ in measured)
            cpu = statistics.median(c for _, c in measured)
            print(f"{strategy:<14}{way:<16}{tok:>12.1f}{total:>10.1f}{cpu:>8.1f}")
    tokenizer.words = words
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
