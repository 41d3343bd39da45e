"""Does adding a lexical score to the cross-encoder's help? Offline, on finished `keyrank eval` runs.

For each system of the run folders' partial/ results, the score of a document becomes
    ce + w * f(query, document)
with f a query-normalised BM25 (general IDF table shipped with keyrank, k1 0.9, b 0.4) in [0, 1]:
    doc:  the whole document, average length --avgdl tokens;
    win:  the best window of --window tokens (stride half of it), average length the window.
f depends on the query and the document only, so a document's score stays the same whatever else is sent.
Prints nDCG@10 for each weight and the paired bootstrap difference to w = 0.

    PYTHONPATH=service python docs/experiments/bm25_interp.py --task qmsum --split train-dev runs/eval/qtd-base
    PYTHONPATH=service python docs/experiments/bm25_interp.py --task farrel --dl20-topics train --seed 9 \
        --constructions 2 runs/eval/frd-base
"""
import argparse
import glob
import json
from pathlib import Path

import numpy as np

from keyrank.config import Settings
from keyrank.data.runs import QueryRun, per_query
from keyrank.evaluation import tasks
from keyrank.pipeline import Pipeline
from keyrank.select.bm25 import general_table, term_mask

K1, B = 0.9, 0.4


def bm25_parts(q_terms, d_terms, idf_of, length, avgdl):
    """Normalised BM25 of one token sequence (0..1: every query term saturated)."""
    vocab, qtf = np.unique(q_terms, return_counts=True)
    if vocab.size == 0:
        return 0.0
    idf = idf_of(vocab)
    tf = np.array([(d_terms == t).sum() for t in vocab], dtype=np.float64)
    norm = K1 * (1 - B + B * length / avgdl)
    sat = tf * (K1 + 1) / (tf + norm)
    return float((sat * idf * qtf).sum() / ((K1 + 1) * (idf * qtf).sum()))


def features(query, tok, mask, idf_of, avgdl, window):
    q = tok.encode_query(query.query, 64).ids
    q = q[mask[q]]
    docs = tok.encode_documents([c.text for c in query.candidates])
    out = {}
    for c, d in zip(query.candidates, docs):
        ids = np.asarray(d.ids)
        terms = ids[mask[ids]]
        f_doc = bm25_parts(q, terms, idf_of, len(terms), avgdl)
        best = 0.0
        for s in range(0, max(1, len(terms) - window // 2), window // 2):
            w = terms[s:s + window]
            best = max(best, bm25_parts(q, w, idf_of, len(w), window))
        out[c.doc_id] = (f_doc, best)
    return out


def boot(diff, rng):
    means = [diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(2000)]
    return np.percentile(means, [2.5, 97.5])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="+")
    p.add_argument("--task", default="qmsum")
    p.add_argument("--split", default="train-dev")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--constructions", type=int, default=1)
    p.add_argument("--dl20-topics", default="held-back")
    p.add_argument("--filler", default="other-topics")
    p.add_argument("--model-dir", default="models")
    p.add_argument("--avgdl", type=float, default=512.0)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--weights", default="0,0.5,1,2,3,4,6")
    a = p.parse_args()
    tok = Pipeline.from_model_dir(Settings(model_dir=Path(a.model_dir))).tokenizer
    mask = term_mask(tok)
    table = general_table(tok)
    queries = tasks.build(a.task, Path("../shared/datasets"), tok, split=a.split, seed=a.seed,
                          constructions=a.constructions, dl20_topics=a.dl20_topics, filler=a.filler)
    feats = {q.qid: features(q, tok, mask, table.lookup, a.avgdl, a.window) for q in queries}
    weights = [float(w) for w in a.weights.split(",")]
    rng = np.random.default_rng(0)
    for folder in a.runs:
        for f in sorted(glob.glob(folder + "/partial/*.json")):
            r = json.load(open(f))
            done = {x["qid"] for x in r["runs"] if x["scores"]}
            qs = [q for q in queries if q.qid in done]
            system = Path(f).stem.split(".", 1)[1]
            for kind, i in (("doc", 0), ("win", 1)):
                base = None
                for w in weights:
                    runs = [QueryRun(qid=x["qid"], system=x["system"],
                                     scores={d: s + w * feats[x["qid"]][d][i] for d, s in x["scores"].items()})
                            for x in r["runs"] if x["scores"]]
                    v = per_query(qs, runs, ["nDCG@10"])
                    arr = np.array([v[q.qid]["nDCG@10"] for q in qs])
                    if base is None:
                        base = arr
                    lo, hi = boot(arr - base, rng)
                    print(f"{folder} {system} {kind} w={w:<4} n={len(qs)} nDCG@10 {arr.mean():.4f} "
                          f"diff {arr.mean() - base.mean():+.4f} [{lo:+.4f}, {hi:+.4f}]", flush=True)
            if a.weights.startswith("0,"):
                fvals = np.array([feats[q][d] for q in done for d in feats[q]])
                print(f"  features: doc mean {fvals[:, 0].mean():.3f} win mean {fvals[:, 1].mean():.3f}")


if __name__ == "__main__":
    main()
