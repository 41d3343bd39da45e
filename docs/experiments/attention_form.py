"""Does OpenVINO run keyrank's ONNX export faster with its attention as ScaledDotProductAttention nodes?

The export spells attention out as MatMul(Q, K^T) * scale + mask -> Softmax -> MatMul(., V); models converted
from PyTorch (sentence-transformers' OpenVINO backend) carry one ScaledDotProductAttention node instead.
This rewrites each such subgraph of the served export into that node, checks that the outputs are unchanged,
and times, on [8 x 512] token ids in bf16 with 2 threads, the plain model compiled twice (A and B: the
control, what a system's place in a round is worth) and the rewritten one, in turns whose order is
reversed every other round; the median of each.

    python docs/experiments/attention_form.py [models/triton/cross_encoder/1/model.onnx] [--rounds 12]
"""
import argparse
import statistics
import time

import numpy as np
import openvino as ov
from openvino import opset13 as ops


def _split(node, kind):
    """``node``'s two inputs, the one a ``kind`` node produces first; (None, None) when neither is."""
    a, b = (node.input(i).get_source_output() for i in range(2))
    for first, second in ((a, b), (b, a)):
        if first.get_node().get_type_name() == kind:
            return first, second
    return None, None


def fuse_attention(model):
    """MatMul(Q, K^T) * s + mask -> Softmax -> MatMul(., V) as one ScaledDotProductAttention."""
    fused = 0
    for sm in model.get_ordered_ops():
        if sm.get_type_name() != "Softmax":
            continue
        add = sm.input(0).get_source_output().get_node()
        if add.get_type_name() != "Add":
            continue
        mul, mask = _split(add, "Multiply")
        if mul is None:
            continue
        qk, scale = _split(mul.get_node(), "MatMul")
        if qk is None or scale.get_node().get_type_name() != "Constant" or scale.get_shape() not in ([], [1]):
            continue
        qk = qk.get_node()
        attrs = qk.get_attributes()
        if attrs.get("transpose_a") or attrs.get("transpose_b"):
            continue
        consumers = list(sm.output(0).get_target_inputs())
        if len(consumers) != 1 or consumers[0].get_node().get_type_name() != "MatMul" or consumers[0].get_index() != 0:
            continue
        av = consumers[0].get_node()
        a2 = av.get_attributes()
        if a2.get("transpose_a") or a2.get("transpose_b"):
            continue
        q = qk.input(0).get_source_output()
        kt = qk.input(1).get_source_output()
        v = av.input(1).get_source_output()
        if q.get_partial_shape().rank.get_length() != 4:
            continue
        k = ops.transpose(kt, ops.constant(np.array([0, 1, 3, 2], np.int64)))
        sdpa = ops.scaled_dot_product_attention(q, k, v, mask, ops.reshape(scale, ops.constant(np.array([], np.int64)), False) if scale.get_shape() == [1] else scale, causal=False)
        sdpa.set_friendly_name(av.get_friendly_name())
        av.output(0).replace(sdpa.output(0))
        fused += 1
    model.validate_nodes_and_infer_types()
    return fused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("onnx", nargs="?", default="models/triton/cross_encoder/1/model.onnx")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--precision", default="bf16")
    args = parser.parse_args()
    config = {"INFERENCE_PRECISION_HINT": args.precision, "INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY",
              "NUM_STREAMS": 1}
    core = ov.Core()
    models = {"A": core.read_model(args.onnx), "B": core.read_model(args.onnx), "sdpa": core.read_model(args.onnx)}
    print(f"attention subgraphs rewritten: {fuse_attention(models['sdpa'])}")
    rng = np.random.default_rng(0)
    b, n = args.batch, args.length
    ids = rng.integers(1000, 30000, size=(b, n)).astype(np.int64)
    mask = np.ones((b, n), np.int64)
    mask[1, n // 2:] = 0  # one padded row
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((b, n), np.int64)}
    requests = {k: core.compile_model(m, "CPU", config).create_infer_request() for k, m in models.items()}
    for r in requests.values():
        r.infer(feeds)
    for name in ("logits", "pooled"):
        diff = np.abs(requests["A"].get_tensor(name).data - requests["sdpa"].get_tensor(name).data).max()
        print(f"{name}: max |sdpa - plain| = {float(diff):.3g}")
    seconds = {k: [] for k in requests}
    for i in range(args.rounds):
        for k in (list(requests) if i % 2 == 0 else list(requests)[::-1]):
            time.sleep(0.3)
            started = time.perf_counter()
            for _ in range(3):
                requests[k].infer(feeds)
            seconds[k].append((time.perf_counter() - started) / 3)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    print("pairs/s: " + ", ".join(f"{k} {b / v:.1f}" for k, v in median.items()))
    print(f"B / A (the control) {median['A'] / median['B']:.3f}x, sdpa / A {median['A'] / median['sdpa']:.3f}x")


if __name__ == "__main__":
    main()
