"""The gateway scoring with ``TorchScorer`` in its own process (no Triton): for a GPU machine
without the nvidia-pytriton wheel, and for the benchmark.

    python -m keyrank.modelserver.gpu_gateway --model-dir models --port 8080 --device cuda

One uvicorn process (the model lives in it); every other setting is the usual KEYRANK_*.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import uvicorn

from keyrank.config import get_settings


def build_app(model_dir: Path, device: str, dtype: str, cuda_graphs: bool):
    from keyrank.api import create_app
    from keyrank.reranker import Reranker

    settings = get_settings().with_overrides(model_dir=model_dir)
    return create_app(settings, Reranker.torch(settings=settings, device=device, dtype=dtype, cuda_graphs=cuda_graphs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keyrank.modelserver.gpu_gateway", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=get_settings().model_dir)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--cuda-graphs", action="store_true")
    args = parser.parse_args(argv)
    app = build_app(args.model_dir, args.device, args.dtype, args.cuda_graphs)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
