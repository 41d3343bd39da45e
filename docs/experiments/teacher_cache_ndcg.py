"""How well do cached teachers rank the QMSum training queries they scored? (docs/EXPERIMENTS.md, 2026-11-26)

A teacher can only lift a student on the queries it is trained on if it ranks them better than
what the student learnt before. This reads `keyrank finetune`'s teacher caches (JSONL
{"qid", "scores"}), grades them against the QMSum train split's judgements and prints
nDCG@10 of each over the queries every cache scored, and of their sum after z-normalising
each query's scores (an ensemble teacher).

    python docs/experiments/teacher_cache_ndcg.py r6-parade-avg=runs/cache/teacher-parade-avg-....jsonl \
        r4-maxp=runs/r6-device/cache/teacher-maxp-torch-bfloat16-....jsonl --tokenizer runs/r6/model/tokenizer.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ir_measures
import numpy as np
from ir_measures import nDCG

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "service"))
from keyrank.tokenize import TextTokenizer  # noqa: E402
from keyrank.training import splits  # noqa: E402
from keyrank.training.cache import TeacherScores  # noqa: E402


def zscores(row: dict[str, float]) -> dict[str, float]:
    values = np.asarray(list(row.values()))
    return {d: (s - values.mean()) / (values.std() + 1e-9) for d, s in row.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("caches", nargs="+", help="label=path of a teacher cache")
    parser.add_argument("--tokenizer", required=True, help="tokenizer.json the training run used (cuts the meetings)")
    parser.add_argument("--data-dir", default="../shared/datasets")
    args = parser.parse_args()
    train, _ = splits.build("qmsum", Path(args.data_dir), TextTokenizer.from_file(args.tokenizer))
    caches = {}
    for spec in args.caches:
        label, path = spec.split("=", 1)
        if not Path(path).is_file():
            raise SystemExit(f"{label}: no teacher cache at {path}")
        caches[label] = TeacherScores(Path(path)).scores
    common = set.intersection(*(set(c) for c in caches.values())) & {q.qid for q in train}
    qrels = [ir_measures.Qrel(q.qid, d, g) for q in train if q.qid in common for d, g in zip(q.doc_ids, q.grades)]
    if len(caches) > 1:
        ensemble = {}
        for q in common:
            rows = [zscores(c[q]) for c in caches.values()]
            ensemble[q] = {d: sum(row[d] for row in rows) for d in rows[0]}
        caches["z-sum of all"] = ensemble
    print(f"{len(common)} QMSum training queries scored by every cache")
    for label, cache in caches.items():
        run = [ir_measures.ScoredDoc(q, d, s) for q in common for d, s in cache[q].items()]
        print(f"{label}: nDCG@10 {ir_measures.calc_aggregate([nDCG @ 10], qrels, run)[nDCG @ 10]:.4f}")


if __name__ == "__main__":
    main()
