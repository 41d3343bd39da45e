"""The `keyrank` command: prepare models, serve, evaluate, benchmark."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from keyrank.config import get_settings



def _serve(args: argparse.Namespace) -> int:
    from keyrank.launcher import serve

    overrides = {k: v for k, v in vars(args).items() if k in ("triton_url", "host", "port", "model_dir", "workers") and v is not None}
    serve(get_settings().with_overrides(**overrides))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="keyrank", description="Re-ranking service for long documents.")
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("prepare", help="export a cross-encoder (+ bi-encoder) to ONNX and write the Triton repositories", add_help=False)

    serve = commands.add_parser("serve", help="run the gateway (and an embedded CPU Triton unless --triton-url)")
    serve.add_argument("--triton-url", help="host:port of an external Triton's gRPC endpoint")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--model-dir", type=Path)
    serve.add_argument("--workers", type=int)
    serve.set_defaults(run=_serve)

    commands.add_parser("eval", help="measure strategies on the judged data in ../shared/datasets", add_help=False)
    commands.add_parser("bench", help="preprocessing throughput vs the raw tokenizer", add_help=False)

    # prepare / eval / bench own their flags: hand them the rest of the line.
    if argv and argv[0] in ("prepare", "eval", "bench"):
        command, rest = argv[0], argv[1:]
        if command == "prepare":
            from keyrank.export import main as prepare_main

            return prepare_main(rest) or 0
        if command == "eval":
            from keyrank.evaluation.cli import main as eval_main

            return eval_main(rest) or 0
        from keyrank.bench import main as bench_main

        return bench_main(rest) or 0

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
