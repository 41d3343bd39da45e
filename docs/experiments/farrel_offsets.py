"""Where far-relevant offsets differ: what keyb2 read of the relevant insert, per offset.

    python docs/experiments/farrel_offsets.py runs/e/r2-farrel-c5 [--system keyb2-bm25]

Reads a `keyrank eval --task farrel` folder (its config.json for the seed,
constructions and offsets, runs/farrel.json for the scores and evidence),
rebuilds the same queries, and prints per offset: nDCG@10 of the system, the
share of the target's insert inside its selected blocks, the share of the
insert's first 100 characters read, nDCG@10 over the rankings where those are
read, and the characters selected outside the insert in the target document.
docs/EXPERIMENTS.md (2026-11-26, two epochs and PSI's noise) reads the table.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from keyrank.evaluation import tasks
from keyrank.evaluation.report import covered_share
from keyrank.tokenize import TextTokenizer

HEAD_CHARS = 100


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="folder `keyrank eval --task farrel --out` wrote")
    p.add_argument("--system", default="keyb2-bm25")
    p.add_argument("--data-dir", type=Path, default=Path("../shared/datasets"))
    args = p.parse_args()
    config = json.loads((args.run / "config.json").read_text())
    tokenizer = TextTokenizer.from_file(Path(config["model_dir"]) / "gateway" / "tokenizer.json")
    queries = {q.qid: q for q in tasks.build(
        "farrel", args.data_dir, tokenizer, seed=config["seed"], max_queries=config["max_queries"],
        offsets=tuple(config["offsets"]), distractors=config["distractors"], filler=config["filler"],
        dl20_topics=config["dl20_topics"], constructions=config.get("constructions", 1))}
    saved = json.loads((args.run / "runs" / "farrel.json").read_text())
    ndcg = saved["per_query"][args.system]  # ir-measures' values, as the report computed them
    rows = defaultdict(lambda: defaultdict(list))
    for run in saved["runs"][args.system]:
        q = queries[run["qid"]]
        target = next(iter(q.qrels))
        start, end = q.meta["inserts"][target]
        spans = run["evidence"].get(target, [])
        covered = covered_share([(start, end)], spans)
        row = rows[q.bucket]
        row["ndcg"].append(ndcg[run["qid"]]["nDCG@10"])
        row["covered"].append(covered)
        row["head"].append(covered_share([(start, min(end, start + HEAD_CHARS))], spans))
        row["outside"].append(sum(span[1] - span[0] for span in spans) - covered * (end - start))
    print(f"{args.system}, {args.run}\n")
    print("| offset | rankings | nDCG@10 | insert covered | its first 100 characters read | nDCG@10 when they are read "
          "| characters read outside the insert |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for bucket in sorted(rows, key=int):
        r = rows[bucket]
        read = [n for n, h in zip(r["ndcg"], r["head"]) if h > 0.99]
        print(f"| {bucket} | {len(r['ndcg'])} | {np.mean(r['ndcg']):.3f} | {np.mean(r['covered']):.3f} | "
              f"{np.mean(r['head']):.3f} | {np.mean(read) if read else float('nan'):.3f} | {np.mean(r['outside']):.0f} |")


if __name__ == "__main__":
    main()
