"""The `keyrank bench` command line: one mode per run, each printing its table (and JSON with --json)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from keyrank.config import get_settings


def main(argv: list[str] | None = None) -> int:
    from keyrank import bench

    parser = argparse.ArgumentParser(prog="keyrank bench", description=bench.__doc__, formatter_class=_Formatter)
    parser.add_argument("--model-dir", type=Path, default=get_settings().model_dir, help="output of `keyrank prepare`")
    parser.add_argument("--datasets", type=Path, default=get_settings().eval_data_dir,
                        help="the shared evaluation data: QMSum, DL20, SQuAD (KEYRANK_EVAL_DATA_DIR)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--cache", action="store_true", help="document cache: documents seen before vs cold, hit rate")
    mode.add_argument("--processes", action="store_true", help="preprocessing over processes: workers vs a pool")
    mode.add_argument("--buckets", action="store_true", help="fixed vs per-request length buckets")
    mode.add_argument("--gpu", action="store_true", help="the GPU figures (CPU parts only without CUDA)")
    mode.add_argument("--peers", action="store_true", help="CPU scoring against sentence-transformers, fastembed, flashrank (the 'peers' extra)")
    mode.add_argument("--query", action="store_true",
                      help="the whole query on CPU: keyb2 and maxp (in-process, embedded Triton) against do-it-yourself MaxP "
                           "with sentence-transformers' OpenVINO backend; queries/s and nDCG@10 on QMSum val")
    parser.add_argument("--docs", type=int, default=20, help="QMSum val meetings (default mode); candidates per request (--cache, --processes, --query: 100)")
    parser.add_argument("--max-chars", type=int, default=60_000, help="characters kept per meeting (default mode)")
    parser.add_argument("--repeats", type=int, default=5, help="measurements per figure (the median is reported)")
    parser.add_argument("--workers", type=int, default=0, help="processes for --processes / the CPU ceiling; 0 = the usable cores")
    parser.add_argument("--requests", type=int, default=0, help="requests per measurement (--processes, --buckets, --gpu, --query: per round); 0 = the mode's default")
    parser.add_argument("--checkpoint", type=Path, default=Path("../shared/models/ce-minilm-l6"),
                        help="--peers, --query: the Hugging Face folder the peers load (the one --model-dir was prepared from)")
    parser.add_argument("--threads", type=int, default=2, help="--peers, --query: threads of every system")
    parser.add_argument("--rounds", type=int, default=3, help="--peers, --query: interleaved rounds (the median is reported)")
    parser.add_argument("--long-pairs", type=int, default=48, help="--peers: 512-token pairs (QMSum chunks)")
    parser.add_argument("--peer-python", action="append", default=[], metavar="KEY=PYTHON",
                        help="--peers: run the peer KEY (a glob, e.g. 'st-onnx*') in a worker process of PYTHON, an "
                             "environment where its library installs (sentence-transformers' ONNX backend pins an older transformers)")
    parser.add_argument("--also", nargs="+", type=Path, default=[], metavar="MODEL_DIR",
                        help="--peers: more prepared folders whose CPU variant runs in-process in the same rounds")
    parser.add_argument("--systems", nargs="+", default=["*"], metavar="KEY",
                        help="--peers: the systems to measure, by key or glob (keyrank-local is always measured)")
    parser.add_argument("--quality-queries", type=int, default=-1,
                        help="--query: QMSum val queries for nDCG@10 (-1 = all 237, 0 = speed only)")
    parser.add_argument("--quality-systems", nargs="+", default=["keyb2-bm25", "diy"], metavar="SYSTEM",
                        help="--query: the systems whose nDCG@10 is measured: diy, or keyrank's in-process rows by their "
                             "--strategies names (maxp costs as much as the DIY baseline)")
    parser.add_argument("--strategies", nargs="+", default=["keyb2-bm25", "maxp"], metavar="SYSTEM",
                        help="--query: keyrank's rows, a strategy or a selecting one with its selector (keyb2-bm25, maxp, cedr-knrm)")
    parser.add_argument("--paths", nargs="+", default=["local", "triton"], choices=("local", "triton"),
                        help="--query: how keyrank's rows score: in-process (local) and/or through the embedded CPU Triton "
                             "(triton, which needs the 'embedded' extra)")
    parser.add_argument("--no-diy", action="store_true",
                        help="--query: keyrank's rows only, without the do-it-yourself baseline (which needs the 'peers' extra)")
    parser.add_argument("--duration", type=float, default=15.0, help="--gpu: seconds of each saturation measurement (concurrency 64)")
    parser.add_argument("--encoder-only", action="store_true",
                        help="--gpu: the CPU ceiling, the bf16 peak and the cross-encoder at 512 tokens only (no HTTP, no baseline)")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)

    if args.cache:
        from keyrank.bench import cache as mode_module

        result = mode_module.run(args.model_dir, args.datasets, candidates=_or(args.docs, 20, 100), repeats=args.repeats)
    elif args.processes:
        from keyrank.bench import processes as mode_module

        result = mode_module.run(args.model_dir, args.datasets, candidates=_or(args.docs, 20, 100),
                                 requests=args.requests or 12, workers=args.workers)
    elif args.buckets:
        from keyrank.bench import buckets as mode_module

        result = mode_module.run(args.model_dir, args.datasets, n_requests=args.requests or 5, repeats=args.repeats)
    elif args.gpu:
        from keyrank.bench import gpu as mode_module

        save = (lambda result: args.json.write_text(json.dumps(result, indent=2))) if args.json else (lambda result: None)
        result = mode_module.run(args.model_dir, args.datasets, requests=args.requests or 100, workers=args.workers,
                                 candidates=_or(args.docs, 20, 100), encoder_only=args.encoder_only, duration_s=args.duration,
                                 save=save)
    elif args.query:
        from keyrank.bench import query as mode_module

        result = mode_module.run(args.model_dir, args.datasets, args.checkpoint, threads=args.threads, rounds=args.rounds,
                                 candidates=_or(args.docs, 20, 100), requests=args.requests or 2,
                                 quality_queries=None if args.quality_queries < 0 else args.quality_queries,
                                 quality_systems=args.quality_systems, diy=not args.no_diy,
                                 strategies=mode_module.parse_systems(args.strategies), paths=tuple(args.paths))
    elif args.peers:
        from keyrank.bench import peers as mode_module
        from keyrank.bench.peer_systems import peer_pythons, select

        chosen = select(args.systems)
        result = mode_module.run(args.model_dir, args.datasets, args.checkpoint, threads=args.threads, rounds=args.rounds,
                                 long_pairs=args.long_pairs, peers=chosen, peer_python=peer_pythons(args.peer_python, chosen),
                                 also=args.also)
    else:
        from keyrank.bench import preprocessing as mode_module

        result = mode_module.run(args.model_dir, args.datasets, args.docs, args.max_chars, args.repeats)
    mode_module.print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default after its help."""


def _or(value: int, default_of_parser: int, default_here: int) -> int:
    """--docs keeps its historical default (20 meetings); the request modes default to 100 candidates."""
    return default_here if value == default_of_parser else value
