"""Which windows should a capped windows strategy read: its first k, or the k best by BM25?

`score` reads every query of a split with maxp in process (`Reranker.local`) and saves, per
document, every window's cross-encoder logit and its BM25 score against the query (the bm25
selector as served: document IDF, k1 0.9, b 0.4). `report` then scores each document as the max
over (a) its first k windows, what `KEYRANK_WINDOW_CAP_BY=first` reads, and (b) its k best windows
by BM25, the default, for k = 1 .. 6, and prints nDCG@10 with the paired bootstrap difference to
every window (k unbounded: maxp). Offline from one scoring of every window, so each k costs nothing;
`keyrank eval` with `KEYRANK_MAX_WINDOWS_PER_DOC=k` gives the served code path's number (equal for maxp).

    PYTHONPATH=service python docs/experiments/window_cap.py score --task qmsum --split train-dev --out runs/wc/qtd.json
    PYTHONPATH=service python docs/experiments/window_cap.py score --task farrel --dl20-topics train --seed 9 \
        --out runs/wc/frd.json
    PYTHONPATH=service python docs/experiments/window_cap.py report runs/wc/qtd.json
"""
import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np

from keyrank.evaluation import tasks
from keyrank.evaluation.compare import paired_difference
from keyrank.reranker import Reranker
from keyrank.resolved import RerankOptions

CAPS = (1, 2, 3, 4, 6)


def score(args) -> None:
    reranker = Reranker.local(args.model_dir)
    pipeline = reranker.pipeline
    queries = tasks.build(args.task, Path(args.datasets), pipeline.tokenizer, split=args.split, seed=args.seed,
                          dl20_topics=args.dl20_topics)
    bm25 = pipeline.block_selector("bm25")
    out, start = [], time.time()
    for i, q in enumerate(queries):
        # Every window (the service's cap, 64, is more than any document of these splits has), by the model and BM25.
        plan = pipeline.plan(q.query, [c.text for c in q.candidates], RerankOptions(strategy="maxp"))
        scores = asyncio.run(reranker.scorer_for(plan.spec).score(plan.inputs, want_pooled=False,
                                                                    deadline=time.monotonic() + 600))
        logits, doc_of = np.asarray(scores.logits, dtype=np.float64), plan.doc_of
        lexical = bm25.score(q.query, plan.query, plan.docs, plan.pieces)
        out.append({"qid": q.qid, "bucket": q.bucket, "qrels": q.qrels, "ids": [c.doc_id for c in q.candidates],
                    "logits": [logits[doc_of == d].tolist() for d in range(len(q.candidates))],
                    "bm25": [s.tolist() for s in lexical]})
        if i % 20 == 0:
            print(f"{i}/{len(queries)} queries, {time.time() - start:.0f} s", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out))
    reranker.close()


def ndcg(data: list[dict], doc_score) -> dict[str, float]:
    import ir_measures
    from ir_measures import Qrel, ScoredDoc, nDCG

    qrels = [Qrel(q["qid"], d, int(g)) for q in data for d, g in q["qrels"].items()]
    run = [ScoredDoc(q["qid"], d, float(doc_score(np.array(w), np.array(b))))
           for q in data for d, w, b in zip(q["ids"], q["logits"], q["bm25"])]
    return {m.query_id: m.value for m in ir_measures.iter_calc([nDCG @ 10], qrels, run)}


def first(k):
    return lambda logits, lexical: logits[:k].max()


def best(k):
    return lambda logits, lexical: logits[np.argsort(-lexical, kind="stable")[:k]].max()


def report(args) -> None:
    data = json.loads(Path(args.scores).read_text())
    every = ndcg(data, lambda logits, lexical: logits.max())
    buckets = sorted({q["bucket"] for q in data}, key=lambda b: (len(b), b))
    windows = [len(w) for q in data for w in q["logits"]]
    print(f"{len(data)} queries, {np.mean(windows):.1f} windows per document (median {np.median(windows):.0f})\n")
    print("| windows read (k) | first k | vs every window | best k by BM25 | vs every window | best - first | best k, per bucket |")
    print("| --- | ---: | --- | ---: | --- | --- | --- |")
    for k in CAPS:
        cells = []
        for rule in (first(k), best(k)):
            per = ndcg(data, rule)
            diff, lo, hi, _ = paired_difference(per, every)
            cells.append((np.mean(list(per.values())), f"{diff:+.3f} [{lo:+.3f}, {hi:+.3f}]", per))
        by = " / ".join(f"{np.mean([cells[1][2][q['qid']] for q in data if q['bucket'] == b]):.3f}" for b in buckets)
        gain, lo, hi, _ = paired_difference(cells[1][2], cells[0][2])
        print(f"| {k} | {cells[0][0]:.3f} | {cells[0][1]} | {cells[1][0]:.3f} | {cells[1][1]} | "
              f"{gain:+.3f} [{lo:+.3f}, {hi:+.3f}] | {by} |")
    by = " / ".join(f"{np.mean([every[q['qid']] for q in data if q['bucket'] == b]):.3f}" for b in buckets)
    print(f"| every window (maxp) | {np.mean(list(every.values())):.3f} | - | | | | {by} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("score")
    s.add_argument("--task", required=True, choices=["qmsum", "farrel"])
    s.add_argument("--split", default="val")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--dl20-topics", default="held-back")
    s.add_argument("--model-dir", default="models")
    s.add_argument("--datasets", default="../shared/datasets")
    s.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("scores")
    args = parser.parse_args()
    score(args) if args.command == "score" else report(args)


if __name__ == "__main__":
    main()
