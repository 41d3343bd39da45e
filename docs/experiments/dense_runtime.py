"""What the dense selector's bi-encoder costs on ONNX Runtime fp32 against OpenVINO bf16, on real requests.

Two in-process Rerankers on the prepared folder, alike but for ``dense_runtime``, each with its block-embedding
cache and the document cache off (every block embedded every time), rank the first QMSum val queries' candidates
with keyb2-blocks and the dense selector, in turns whose order is reversed every other query. Prints each
runtime's median ``select`` stage (the bi-encoder over every block of the candidates, tokenization included),
blocks embedded a second, the largest difference between the two runtimes' document scores, and how often the
two rank the candidates alike.

    python docs/experiments/dense_runtime.py [--model-dir models] [--queries 12]
"""
import argparse
import statistics
from pathlib import Path

import numpy as np

from keyrank import Reranker, RerankOptions
from keyrank.evaluation import tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="models")
    parser.add_argument("--data-dir", default="../shared/datasets")
    parser.add_argument("--queries", type=int, default=12)
    args = parser.parse_args()
    runtimes = ("onnxruntime", "openvino")
    rerankers = {r: Reranker.local(args.model_dir, dense_runtime=r, dense_cache_size=0, document_cache_bytes=0) for r in runtimes}
    queries = tasks.build("qmsum", Path(args.data_dir), rerankers["onnxruntime"].tokenizer, split="val")[: args.queries]
    select_ms: dict[str, list[float]] = {r: [] for r in runtimes}
    blocks_per_s: dict[str, list[float]] = {r: [] for r in runtimes}
    differences, same_order = [], 0
    for i, query in enumerate(queries):
        texts = [c.text for c in query.candidates]
        rankings = {}
        # The blocks every selector scores: segmentation does not depend on the selector.
        segmented = rerankers["onnxruntime"].pipeline.start(query.query, texts, RerankOptions(strategy="keyb2-blocks", selector="bm25"))
        blocks = sum(len(p) for p in segmented.pieces)
        for r in (runtimes if i % 2 == 0 else runtimes[::-1]):
            ranking = rerankers[r].rank(query.query, texts, strategy="keyb2-blocks", selector="dense")
            rankings[r] = ranking
            select_ms[r].append(ranking.timings_ms["select"])
            blocks_per_s[r].append(blocks / (ranking.timings_ms["select"] / 1000))
        scores = {r: np.array([x.score for x in sorted(rankings[r].results, key=lambda x: x.index)]) for r in runtimes}
        differences.append(float(np.abs(scores["onnxruntime"] - scores["openvino"]).max()))
        same_order += [x.index for x in rankings["onnxruntime"].results] == [x.index for x in rankings["openvino"].results]
    for r in runtimes:
        print(f"{r}: select median {statistics.median(select_ms[r]):.0f} ms a query, "
              f"{statistics.median(blocks_per_s[r]):.0f} blocks/s ({rerankers[r].pipeline.block_selector('dense').precision})")
    print(f"openvino / onnxruntime: {statistics.median(select_ms['onnxruntime']) / statistics.median(select_ms['openvino']):.2f}x; "
          f"max |document score difference| {max(differences):.4f}; same order in {same_order} of {len(queries)} queries")


if __name__ == "__main__":
    main()
