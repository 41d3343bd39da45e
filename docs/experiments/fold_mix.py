"""Two systems' document scores mixed, offline, on finished `keyrank eval` runs.

    PYTHONPATH=service python docs/experiments/fold_mix.py --task qmsum --split train-dev \
        runs/eval/kbf-qtd kbf-lse-bm25 kbf-pmax-bm25

For every query both systems answered, a document's score becomes the mean of its two scores (both are
the cross-encoder's logits for the same document, so they share a scale); with --lse, their log-sum-exp (b
shifted by --shift); with --weight W, a + W x b. Prints nDCG@10 of each system and of the mix, per position
bucket too, and the mix's paired bootstrap difference to each and to every --against FOLDER:SYSTEM of another
finished run. A diagnostic for choosing on dev: nothing in the product changes.
"""
import argparse
import json
from pathlib import Path

import numpy as np

from keyrank.config import Settings
from keyrank.data.runs import QueryRun, per_query
from keyrank.evaluation import tasks
from keyrank.evaluation.compare import paired_difference
from keyrank.pipeline import Pipeline


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--b-run", help="the run folder of system b, if not the same")
    p.add_argument("--task", default="qmsum")
    p.add_argument("--split", default="train-dev")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-queries", type=int)
    p.add_argument("--constructions", type=int, default=1)
    p.add_argument("--dl20-topics", default="held-back")
    p.add_argument("--filler", default="other-topics")
    p.add_argument("--model-dir", default="models")
    p.add_argument("--lse", action="store_true", help="log-sum-exp of the two scores instead of their mean")
    p.add_argument("--shift", type=float, default=0.0, help="with --lse: added to b's score first")
    p.add_argument("--weight", type=float, help="a + WEIGHT x b instead of the mean")
    p.add_argument("--against", action="append", default=[], help="FOLDER:SYSTEM of another run, for a paired difference")
    args = p.parse_args()
    tok = Pipeline.from_model_dir(Settings(model_dir=Path(args.model_dir))).tokenizer
    queries = tasks.build(args.task, Path("../shared/datasets"), tok, split=args.split, seed=args.seed,
                          constructions=args.constructions, dl20_topics=args.dl20_topics, filler=args.filler,
                          max_queries=args.max_queries)

    def load(folder, system):
        data = json.load(open(Path(folder) / "partial" / f"{args.task}.{system}.json"))
        return {x["qid"]: x["scores"] for x in data["runs"] if x["scores"]}

    sa, sb = load(args.run, args.a), load(args.b_run or args.run, args.b)
    others = {spec: load(*spec.rsplit(":", 1)) for spec in args.against}
    qs = [q for q in queries if q.qid in sa and q.qid in sb and all(q.qid in o for o in others.values())]
    qids = [q.qid for q in qs]

    def mixed(x, y):
        if args.lse:
            return np.logaddexp(x, y + args.shift)
        return x + args.weight * y if args.weight is not None else (x + y) / 2

    systems = {
        args.a: sa,
        args.b: sb,
        "mix": {qid: {d: mixed(sa[qid][d], sb[qid][d]) for d in sa[qid]} for qid in sa if qid in sb},
        **others,
    }
    ndcg = {}
    for name, scores in systems.items():
        runs = [QueryRun(qid=q.qid, system=name, scores=scores[q.qid]) for q in qs]
        v = per_query(qs, runs, ["nDCG@10"])
        ndcg[name] = np.array([v[q.qid]["nDCG@10"] for q in qs])
    buckets = sorted({q.bucket for q in qs}, key=lambda b: int(str(b).split("-")[0].rstrip("+")))
    print(f"{args.run} {args.task} n={len(qs)}; buckets {' / '.join(map(str, buckets))}")
    for name, arr in ndcg.items():
        by = " / ".join(f"{arr[[q.bucket == b for q in qs]].mean():.3f}" for b in buckets)
        line = f"  {name:<20} nDCG@10 {arr.mean():.4f}  ({by})"
        if name == "mix":
            for other in (args.a, args.b, *others):
                mean, lo, hi, _ = paired_difference(dict(zip(qids, arr)), dict(zip(qids, ndcg[other])))
                line += f"  - {other} {mean:+.4f} [{lo:+.4f}, {hi:+.4f}]"
        print(line, flush=True)


if __name__ == "__main__":
    main()
