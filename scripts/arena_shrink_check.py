"""Does shrinking ONNX Runtime's arena after every run cost speed at 512 tokens? (docs/PERFORMANCE.md)

    python scripts/arena_shrink_check.py     # the prepared models/ folder; 2 threads; medians of 5 interleaved runs
"""
import time, numpy as np, onnxruntime as ort, statistics
path="models/triton-embedded/cross_encoder/1/model.onnx"
def sess():
    o=ort.SessionOptions(); o.intra_op_num_threads=2; o.inter_op_num_threads=1
    o.execution_mode=ort.ExecutionMode.ORT_SEQUENTIAL; o.enable_cpu_mem_arena=True; o.enable_mem_pattern=False
    return ort.InferenceSession(path,o,providers=["CPUExecutionProvider"])
s=sess(); names=[i.name for i in s.get_inputs()]
rng=np.random.default_rng(0)
for rows in (6,18):
    feed={n:(rng.integers(1000,20000,(rows,512)) if n=="input_ids" else (np.ones((rows,512),np.int64) if n=="attention_mask" else np.zeros((rows,512),np.int64))).astype(np.int64) for n in names}
    shrink=ort.RunOptions(); shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage","cpu:0")
    plain=ort.RunOptions()
    res={"shrink":[],"keep":[]}
    s.run(None,feed,plain)
    for r in range(5):
        for k,opt in (("shrink",shrink),("keep",plain)):
            t=time.perf_counter(); s.run(None,feed,opt); res[k].append(rows/(time.perf_counter()-t))
    print(rows, {k:round(statistics.median(v),2) for k,v in res.items()}, flush=True)
