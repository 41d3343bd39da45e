"""Does OpenVINO score more 512-token pairs a second on 2 cores with two streams than with the served one?

The served CPU model runs one stream with every core on it (PERFORMANCE_HINT LATENCY: one batch at a time,
the lowest latency per request). OpenVINO's THROUGHPUT hint instead runs two batches side by side, one
core each. This times 48 pairs of random token ids [48 x 512] in bf16 both ways (batches of 8 through one
infer request; batches of 8 and of 4 through an ``AsyncInferQueue`` of two), in rounds whose order is
reversed every other round, checks the scores agree, and prints each median.

    python docs/experiments/ov_streams.py [models/triton-embedded/cross_encoder/1/model.onnx] [--rounds 4]
"""
import argparse
import time

import numpy as np
import openvino as ov

PAIRS, LENGTH, BATCH = 48, 512, 8


def feeds_for(model: ov.Model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for port in model.inputs:
        name = port.get_any_name()
        if "mask" in name:
            out[name] = np.ones((PAIRS, LENGTH), np.int64)
        elif "type" in name:  # a 40-token query, the rest document
            out[name] = np.concatenate([np.zeros((PAIRS, 40), np.int64), np.ones((PAIRS, LENGTH - 40), np.int64)], 1)
        else:
            out[name] = rng.integers(1000, 30000, (PAIRS, LENGTH)).astype(np.int64)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="models/triton-embedded/cross_encoder/1/model.onnx")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    core = ov.Core()
    model = core.read_model(args.model)
    feeds = feeds_for(model)
    common = {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": "2"}
    served = core.compile_model(model, "CPU", {**common, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"})
    streams = core.compile_model(model, "CPU", {**common, "PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": "2"})
    request = served.create_infer_request()

    def one_stream(batch: int) -> np.ndarray:
        return np.concatenate([request.infer({k: v[s:s + batch] for k, v in feeds.items()})[0].copy()
                               for s in range(0, PAIRS, batch)])

    def two_streams(batch: int) -> np.ndarray:
        queue, got = ov.AsyncInferQueue(streams, 2), {}
        queue.set_callback(lambda r, s: got.__setitem__(s, r.get_output_tensor(0).data.copy()))
        for s in range(0, PAIRS, batch):
            queue.start_async({k: v[s:s + batch] for k, v in feeds.items()}, userdata=s)
        queue.wait_all()
        return np.concatenate([got[s] for s in sorted(got)])

    systems = {"1 stream x 2 threads (served), batch 8": lambda: one_stream(BATCH),
               "2 streams x 1 thread, batch 8": lambda: two_streams(BATCH),
               "2 streams x 1 thread, batch 4": lambda: two_streams(4)}
    print("max |score difference|:", float(np.abs(one_stream(BATCH) - two_streams(BATCH)).max()))
    rates: dict[str, list[float]] = {name: [] for name in systems}
    for r in range(args.rounds):
        for name in (list(systems) if r % 2 == 0 else list(systems)[::-1]):
            time.sleep(0.5)  # spinning thread pools go idle between systems
            start = time.perf_counter()
            systems[name]()
            rates[name].append(PAIRS / (time.perf_counter() - start))
    for name, values in rates.items():
        print(f"{name}: median {np.median(values):.1f} pairs/s, rounds {[round(v, 1) for v in values]}")


if __name__ == "__main__":
    main()
