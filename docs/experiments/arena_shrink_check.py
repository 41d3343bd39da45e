"""Does shrinking ONNX Runtime's arena after every run cost speed at 512 tokens? (docs/EXPERIMENTS.md, 2026-11-25)

    python docs/experiments/arena_shrink_check.py     # the prepared models/ folder; 2 threads; medians of 5 interleaved runs

The serving session (``session_options``: arena on, memory pattern off) run with the serving per-run
options (``run_options``: the arena shrunk when the run ends) against plain runs that keep it.
"""
import statistics
import time

import numpy as np
import onnxruntime as ort

from keyrank.scoring.local import run_options, session_options

PATH = "models/triton-embedded/cross_encoder/1/model.onnx"

session = ort.InferenceSession(PATH, session_options(2), providers=["CPUExecutionProvider"])
names = [i.name for i in session.get_inputs()]
rng = np.random.default_rng(0)
for rows in (6, 18):
    shapes = {"input_ids": rng.integers(1000, 20000, (rows, 512)), "attention_mask": np.ones((rows, 512)),
              "token_type_ids": np.zeros((rows, 512))}
    feed = {name: shapes[name].astype(np.int64) for name in names}
    options = {"shrink": run_options(), "keep": ort.RunOptions()}
    rates: dict[str, list[float]] = {k: [] for k in options}
    session.run(None, feed, options["keep"])
    for _ in range(5):
        for kind, opts in options.items():
            started = time.perf_counter()
            session.run(None, feed, opts)
            rates[kind].append(rows / (time.perf_counter() - started))
    print(rows, {kind: round(statistics.median(v), 2) for kind, v in rates.items()}, flush=True)
