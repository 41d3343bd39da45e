"""keyb2-bm25 with each BM25 IDF source on one task, in one process (docs/SELECTION.md, "IDF sources").

    python docs/experiments/idf_sources.py --task qmsum --split val --model-dir runs/c/base --out runs/idf-qmsum \
        --sources request document general table --table runs/idf-qmsum-corpus.json
    python docs/experiments/idf_sources.py --task qmsum --split val --corpus-out runs/idf-qmsum-corpus.jsonl   # the collection

It is ``keyrank eval --strategies keyb2 --selectors bm25 --scorer local`` once per
source (``KEYRANK_BM25_IDF``), with the same queries, the same ``Reranker.arank``
path and the same report: each source is written to ``<out>/<source>/`` as
``keyrank eval --out`` writes (``python -m keyrank.evaluation.compare`` reads it).
The one difference: the sources share one ``MemoScorer``, so a sequence two
sources both selected (most of them) is scored once; scores are unchanged (the
memo answers the same logit), only wall times favour the later sources.

``--corpus-out`` writes the task's candidate texts (each distinct text once, as
``{"id", "text"}`` JSONL): the "user's own collection" that ``keyrank idf
--docs`` turns into the ``table`` source's IDF. It reads texts only, no
judgements.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from keyrank.config import Settings
from keyrank.evaluation import report, tasks
from keyrank.evaluation.cli import _checkpoint_key
from keyrank.evaluation.memo import MemoScorer
from keyrank.evaluation.runner import System, run_task
from keyrank.reranker import Reranker
from keyrank.tokenize import TextTokenizer

SOURCES = ("request", "document", "general", "table")


async def run_sources(args, queries: dict, out: Path) -> None:
    base = Settings(model_dir=args.model_dir)
    local = await asyncio.to_thread(Reranker.local, None, base)
    memo = MemoScorer(local.scorer)
    systems_ = [System("keyb2", "bm25")]
    try:
        for source in args.sources:
            overrides = {"bm25_idf": source, "bm25_idf_table": args.table if source == "table" else None}
            settings = base.with_overrides(**overrides)
            reranker = Reranker(settings, scorer=memo)
            folder = out / source
            runs, started = {}, time.perf_counter()
            key_args = argparse.Namespace(scorer="local", timeout_s=args.timeout_s)
            for task, task_queries in queries.items():
                runs[task] = await run_task(reranker, systems_, task_queries, task=task, timeout_s=args.timeout_s,
                                            progress=False, checkpoints=folder / "partial",
                                            key=_checkpoint_key(key_args, settings, reranker.pipeline.manifest, task_queries))
            run_s = time.perf_counter() - started
            reports = {t: report.summarize(t, queries[t], runs[t], seed=args.seed) for t in queries}
            header = (f"# keyrank eval, BM25 IDF source `{source}`\n\n`{' '.join(sys.argv)}`\n\nseed {args.seed}, "
                      f"split {args.split}, scorer local (shared memo: {memo.misses} scored, {memo.hits} from memory "
                      f"so far); ran in {run_s:.1f} s\n\n")
            report.write(folder, reports, runs, header=header)
            (folder / "config.json").write_text(json.dumps({"command": " ".join(sys.argv), "source": source, **{
                k: str(v) for k, v in overrides.items()}, "seed": args.seed, "split": args.split, "run_s": run_s}, indent=2))
            print(f"{source}: {run_s:.0f} s, memo {memo.misses} scored / {memo.hits} remembered", file=sys.stderr, flush=True)
    finally:
        local.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, help="qmsum | farrel (with farrel-bare)")
    p.add_argument("--split", default="val")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-queries", type=int, default=None)
    p.add_argument("--data-dir", type=Path, default=Settings().eval_data_dir)
    p.add_argument("--model-dir", type=Path, default=Path("models"))
    p.add_argument("--sources", nargs="+", choices=SOURCES, default=list(SOURCES))
    p.add_argument("--table", type=Path, default=None, help="the table source's IDF (keyrank idf --docs)")
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--corpus-out", type=Path, default=None, help="write the task's candidate texts as JSONL and stop")
    args = p.parse_args()
    if "table" in args.sources and args.table is None and args.corpus_out is None:
        p.error("--sources table needs --table")
    tokenizer = TextTokenizer.from_file(args.model_dir / "gateway" / "tokenizer.json")
    queries = {t: tasks.build(t, args.data_dir, tokenizer, split=args.split, seed=args.seed, max_queries=args.max_queries)
               for t in tasks.expand([args.task])}
    if args.corpus_out is not None:
        seen: dict[str, str] = {}
        for qs in queries.values():
            for q in qs:
                for c in q.candidates:
                    seen.setdefault(c.text, c.doc_id)
        args.corpus_out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.corpus_out, "w", encoding="utf-8") as f:
            for text, doc_id in seen.items():
                f.write(json.dumps({"id": doc_id, "text": text}) + "\n")
        print(f"wrote {args.corpus_out}: {len(seen)} distinct candidate texts", file=sys.stderr)
        return 0
    if args.out is None:
        p.error("--out is needed")
    asyncio.run(run_sources(args, queries, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
