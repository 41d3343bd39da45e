"""`keyrank bench`: measurements taken in one run, printed as ratios.

    keyrank bench                 preprocessing vs the raw tokenizer (bench/preprocessing.py)
    keyrank bench --cache         documents seen before vs cold, and the hit rate of a popular-documents workload (bench/cache.py)
    keyrank bench --processes     preprocessing over processes: uvicorn-style workers vs a process pool (bench/processes.py)
    keyrank bench --buckets       padded tokens and ONNX time, fixed vs per-request length buckets (bench/buckets.py)
    keyrank bench --gpu           the GPU figures (docs/PERFORMANCE.md, section 5); on a CPU machine the CPU parts only (bench/gpu.py)
    keyrank bench --peers         CPU scoring side by side with sentence-transformers, fastembed, flashrank (bench/peers.py)
"""

from keyrank.bench.cli import main
from keyrank.bench.preprocessing import CASES, preprocess, run
from keyrank.bench.workloads import meeting_documents

__all__ = ["CASES", "main", "meeting_documents", "preprocess", "run"]
