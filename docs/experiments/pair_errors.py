"""Which judged pairs a finished run orders wrongly, by the grades of the pair, and the grade it ranks first.

    PYTHONPATH=service python docs/experiments/pair_errors.py --task qmsum --split train-dev --seed 0 \
        runs/eval/A:keyb2-blocks-bm25 runs/eval/B:parade-avg

For every query and every pair of candidates with different grades, the pair is an error when the lower grade
scores at least as high. On QMSum this tells "a relevant segment below an unrelated one" (1 > 0, 2 > 0) from
"the segment with most of the evidence below one with a little" (2 > 1). The queries (and their grades) are
built again with the run's task arguments. A diagnostic: nothing in the product changes.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from keyrank.config import Settings
from keyrank.evaluation import tasks
from keyrank.tokenize import TextTokenizer


def pair_errors(runs: list[dict], qrels: dict[str, dict[str, int]]) -> tuple[Counter, Counter, Counter]:
    """(errors, pairs) by (higher grade, lower grade), and how often each grade is ranked first."""
    errors, pairs, first = Counter(), Counter(), Counter()
    for run in runs:
        grades, scores = qrels[run["qid"]], run["scores"]
        first[grades.get(max(scores, key=scores.get), 0)] += 1
        for a, sa in scores.items():
            for b, sb in scores.items():
                ga, gb = grades.get(a, 0), grades.get(b, 0)
                if ga > gb:
                    pairs[(ga, gb)] += 1
                    errors[(ga, gb)] += sa <= sb
    return errors, pairs, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("systems", nargs="+", help="<run folder>:<system>")
    parser.add_argument("--task", default="qmsum")
    parser.add_argument("--split", default="val")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dl20-topics", default="held-back")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/datasets"))
    parser.add_argument("--model-dir", type=Path, default=Path("models"), help="the runs' `keyrank prepare` output (its tokenizer)")
    args = parser.parse_args()
    tokenizer = TextTokenizer.from_file(Settings(model_dir=args.model_dir).gateway_dir / "tokenizer.json")  # as `keyrank eval` reads it
    queries = tasks.build(args.task, args.data_dir, tokenizer, split=args.split, seed=args.seed, dl20_topics=args.dl20_topics)
    qrels = {q.qid: q.qrels for q in queries}
    print("| system | ranked first: grade 2 / 1 / 0 | errors 1 > 0 | errors 2 > 0 | errors 2 > 1 |")
    print("| --- | --- | ---: | ---: | ---: |")
    for spec in args.systems:
        folder, system = spec.rsplit(":", 1)
        runs = [r for r in json.loads((Path(folder) / "runs" / f"{args.task}.json").read_text())["runs"][system]
                if r["qid"] in qrels]
        errors, pairs, first = pair_errors(runs, qrels)
        cells = [f"{errors[k]} / {pairs[k]}" for k in ((1, 0), (2, 0), (2, 1))]
        print(f"| {spec} | {first[2]} / {first[1]} / {first[0]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
