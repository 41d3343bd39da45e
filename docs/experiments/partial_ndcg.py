"""nDCG@10 on QMSum val of the systems `keyrank eval --task qmsum --split val` runs finished (their partial/ folders), and
paired bootstrap differences: for a run stopped before its last systems, or systems split over several runs.

    PYTHONPATH=service python docs/experiments/partial_ndcg.py runs/eval/qv-zoo [runs/eval/qv-zoo2 ...]   # expects runs/m-cedr
"""
import json, sys, glob
from pathlib import Path
import numpy as np
from keyrank.config import Settings
from keyrank.pipeline import Pipeline
from keyrank.data import qmsum
from keyrank.data.runs import QueryRun, per_query
tok = Pipeline.from_model_dir(Settings(model_dir=Path("runs/m-cedr"))).tokenizer
queries = qmsum.build(Path("../shared/datasets"), tok, split="val", seed=0)
print(len(queries), "queries")
files = sorted(f for folder in sys.argv[1:] for f in glob.glob(folder + "/partial/*.json"))
for f in files:
    r = json.load(open(f))
    runs = [QueryRun(qid=x["qid"], system=x["system"], scores=x["scores"]) for x in r["runs"]]
    done = {x.qid for x in runs}
    qs = [q for q in queries if q.qid in done]
    v = per_query(qs, runs, ["nDCG@10"])
    tokens = np.mean([x["scored_tokens"] for x in r["runs"]]); ms = np.median([x["wall_ms"] for x in r["runs"]])
    print(Path(f).name, len(qs), round(float(np.mean([v[q.qid]["nDCG@10"] for q in qs])), 4), "tokens", round(tokens), "ms", round(ms))
per = {}
for f in files:
    r = json.load(open(f)); name = Path(f).stem.split(".", 1)[1]
    runs = [QueryRun(qid=x["qid"], system=x["system"], scores=x["scores"]) for x in r["runs"]]
    v = per_query(queries, runs, ["nDCG@10"]); per[name] = np.array([v[q.qid]["nDCG@10"] for q in queries])
rng = np.random.default_rng(0)
for a, b in [("cedr-knrm", "maxp"), ("cedr-knrm", "avgp"), ("model1", "maxp"), ("model1", "avgp"), ("parade-attn", "maxp"),
             ("cedr-drmm", "maxp"), ("cedr-drmm", "avgp"), ("cedr-pacrr", "maxp"), ("cedr-pacrr", "avgp")]:
    if a in per and b in per:
        d = per[a] - per[b]; bs = [d[rng.integers(0, len(d), len(d))].mean() for _ in range(2000)]
        print(f"{a} - {b}: {d.mean():+.3f} [{np.percentile(bs, 2.5):+.3f}, {np.percentile(bs, 97.5):+.3f}]")
