"""Preprocessing over worker processes with rayon's thread count per worker set or not (docs/PERFORMANCE.md, section 2).

    .venv/bin/python docs/experiments/rayon_threads.py unset 1 16   # RAYON_NUM_THREADS values, in the order given
"""
import os, sys, json
from pathlib import Path
sys.path.insert(0, "service")
from keyrank.bench.workloads import candidate_documents
from keyrank.bench.processes import worker_processes
from keyrank.pipeline import Pipeline, RerankOptions
from keyrank.config import get_settings
if __name__ == '__main__':
    md = Path("models")
    tok = Pipeline.from_model_dir(get_settings().with_overrides(model_dir=md, document_cache_bytes=0)).tokenizer
    pool, queries = candidate_documents(Path("../shared/datasets"), tok, 200)
    opts = RerankOptions(strategy="keyb2", selector="bm25")
    res = {}
    for threads in sys.argv[1:]:
        if threads == "unset":
            os.environ.pop("RAYON_NUM_THREADS", None)
        else:
            os.environ["RAYON_NUM_THREADS"] = threads
        walls = [worker_processes(md, queries[0], pool[:100], 8, 2, opts)[0] for _ in range(3)]
        res[threads] = sorted(walls)[1]
        print(threads, f"median wall for 8 requests over 2 processes: {res[threads]:.2f} s ({8/res[threads]:.2f} q/s)", flush=True)
