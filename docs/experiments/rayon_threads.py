"""Preprocessing over worker processes with rayon's thread count per worker set or not (docs/PERFORMANCE.md, section 2).

    .venv/bin/python docs/experiments/rayon_threads.py unset 1 16   # RAYON_NUM_THREADS values, in the order given

keyb2-bm25 on 100 QMSum candidates of ~2k tokens, 8 requests over 2 spawned worker processes (as uvicorn workers),
the median wall time of 3 rounds per value. The workers read RAYON_NUM_THREADS when they start.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, "service")

from keyrank.bench.processes import worker_processes  # noqa: E402
from keyrank.bench.workloads import candidate_documents  # noqa: E402
from keyrank.config import get_settings  # noqa: E402
from keyrank.pipeline import Pipeline, RerankOptions  # noqa: E402


def main(values: list[str]) -> None:
    models = Path("models")
    tokenizer = Pipeline.from_model_dir(get_settings().with_overrides(model_dir=models, document_cache_bytes=0)).tokenizer
    pool, queries = candidate_documents(Path("../shared/datasets"), tokenizer, 200)
    options = RerankOptions(strategy="keyb2", selector="bm25")
    for value in values:
        if value == "unset":
            os.environ.pop("RAYON_NUM_THREADS", None)
        else:
            os.environ["RAYON_NUM_THREADS"] = value
        wall = sorted(worker_processes(models, queries[0], pool[:100], 8, 2, options)[0] for _ in range(3))[1]
        print(f"RAYON_NUM_THREADS={value}: {wall:.2f} s for 8 requests over 2 processes ({8 / wall:.2f} q/s)", flush=True)


if __name__ == "__main__":  # spawned workers import this module again
    main(sys.argv[1:])
