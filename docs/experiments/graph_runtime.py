"""Which runtime for the interaction graphs (CEDR, Model 1)? (docs/PERFORMANCE.md section 7)

    python docs/experiments/graph_runtime.py runs/m-cedr/gateway/cedr-knrm-features.onnx   # 2 threads, 5 interleaved rounds

One [8 x 512] batch (a 20-token query, the rest document, as the gateway frames a chunk) through ONNX
Runtime fp32 (the reference), OpenVINO f32 and OpenVINO bf16 in the same rounds: the median ms per
sequence of each, and how far each moves the chunk features (``pooled``: [CLS] | query slots | sums)
from ONNX Runtime's, as the largest absolute and the 99th-percentile and largest relative difference.
"""
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
import openvino as ov

from keyrank.scoring.local import session_options

PATH, N, L, THREADS, ROUNDS = sys.argv[1], 8, 512, 2, 5
rng = np.random.default_rng(0)
ids = rng.integers(1000, 20000, (N, L)).astype(np.int64)
ids[:, 0] = 101
roles = np.full((N, L), 2, np.int64)  # 1 query, 2 document, 0 frame
roles[:, 1:21], roles[:, [0, 21, -1]] = 1, 0
feeds = {"input_ids": ids, "attention_mask": np.ones((N, L), np.int64), "token_type_ids": (roles == 2).astype(np.int64),
         "token_roles": roles}

reference = ort.InferenceSession(PATH, session_options(THREADS), providers=["CPUExecutionProvider"])
core = ov.Core()
compiled = {p: core.compile_model(PATH, "CPU", {"INFERENCE_PRECISION_HINT": p, "INFERENCE_NUM_THREADS": THREADS,
                                                 "PERFORMANCE_HINT": "LATENCY"}) for p in ("f32", "bf16")}
systems = {"onnxruntime fp32": lambda: reference.run(None, feeds)}
systems.update({f"openvino {p}": (lambda c=c: [c(feeds)[o] for o in c.outputs]) for p, c in compiled.items()})
answers = {name: run() for name, run in systems.items()}  # warm-up, and the features compared
times: dict[str, list[float]] = {name: [] for name in systems}
for _ in range(ROUNDS):
    for name, run in systems.items():
        started = time.perf_counter()
        run()
        times[name].append((time.perf_counter() - started) / N * 1e3)
base = statistics.median(times["onnxruntime fp32"])
ref = answers["onnxruntime fp32"][1]
for name in systems:
    diff = np.abs(answers[name][1] - ref)
    rel = diff / (np.abs(ref) + 1e-3)
    ms = statistics.median(times[name])
    print(f"{name}: {ms:.1f} ms/sequence ({base / ms:.2f}x onnxruntime), features max abs diff {diff.max():.2e}, "
          f"relative p99 {np.percentile(rel, 99):.2e} max {rel.max():.2e}")
