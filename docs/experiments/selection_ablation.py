"""KeyB2 selection ablation (docs/SELECTION.md) on QMSum **train**: which blocks read better?

    .venv/bin/python docs/experiments/selection_ablation.py --model-dir models --model-queries 40 --out runs/selection

Never on val: val is the split keyrank reports, so a variant chosen on it would
be tuned on the test set. Every train query's candidates (the segments of its
meeting, ``keyrank eval``'s QMSum construction) go through the serving
``Pipeline``'s own stages: encode, segment into CogLTX blocks, score the blocks
once per selector (bm25, dense, and hybrid = RRF of the two), then each
variant assembles with ``keyb2_passages``, the call the pipeline serves with,
under its settings. Two measures:

- evidence recall (no model, all queries): the share of a relevant segment's
  evidence characters inside the selected blocks, averaged over relevant
  segments (``report.evidence_stats``, as in ``keyrank eval``), and the share of
  relevant segments with any evidence selected (hit);
- nDCG@10 (the cross-encoder, in-process ONNX Runtime) on a seeded,
  bucket-stratified sample of ``--model-queries`` queries; an input two
  variants share is scored once.

The cross selector is left out: it scores every block with the cross-encoder
first (hundreds of passes per query), out of reach on a CPU.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from keyrank.config import Settings
from keyrank.data.queries import EvalQuery, subsample
from keyrank.data.runs import QueryRun
from keyrank.evaluation import report, tasks
from keyrank.pipeline import Pipeline, RerankOptions
from keyrank.select.hybrid import hybrid_scores
from keyrank.strategies import Passage
from keyrank.strategies.keyb2 import keyb2_passages

VARIANTS: dict[str, dict] = {
    "plain (paper480)": {},
    "fill budget": {"keyb2_budget": "fill"},
    "lead block": {"keyb2_keep_lead": True},
    "neighbours, top 10%": {"keyb2_neighbours": True, "keyb2_top_share": 0.1},
    "neighbours, top 25%": {"keyb2_neighbours": True, "keyb2_top_share": 0.25},
    "neighbours, top 50%": {"keyb2_neighbours": True, "keyb2_top_share": 0.5},
    "neighbours, top 75%": {"keyb2_neighbours": True, "keyb2_top_share": 0.75},
    "dedup J>=0.8": {"keyb2_dedup_jaccard": 0.8},
    "dedup J>=0.5": {"keyb2_dedup_jaccard": 0.5},
    "fill + neighbours 50%": {"keyb2_budget": "fill", "keyb2_neighbours": True, "keyb2_top_share": 0.5},
    "fill + lead + neighbours 50%": {"keyb2_budget": "fill", "keyb2_keep_lead": True, "keyb2_neighbours": True,
                                     "keyb2_top_share": 0.5},
    "all (fill, lead, neighbours 50%, dedup 0.8)": {"keyb2_budget": "fill", "keyb2_keep_lead": True, "keyb2_neighbours": True,
                                                    "keyb2_top_share": 0.5, "keyb2_dedup_jaccard": 0.8},
}
"""Variant name -> the ``Settings`` fields it changes from the defaults."""
SELECTORS = ("bm25", "dense", "hybrid")


def block_scores(pipeline: Pipeline, query: EvalQuery, selectors: Sequence[str]):
    """Encode and segment the candidates once; score their blocks with every selector."""
    query_enc, docs = pipeline.encode(query.query, [c.text for c in query.candidates])
    resolved = pipeline.resolve(RerankOptions(strategy="keyb2", selector="bm25"))
    fits = resolved.budget(len(query_enc))
    pieces = pipeline.segment(docs, resolved, fits)
    scores = {}
    for selector in {"bm25", "dense"} & set(selectors) | ({"bm25", "dense"} if "hybrid" in selectors else set()):
        scores[selector] = pipeline.block_selector(selector).score(query.query, query_enc, docs, pieces)
    if "hybrid" in selectors:
        scores["hybrid"] = hybrid_scores(scores["bm25"], scores["dense"], k=pipeline.settings.hybrid_rrf_k)
    return query_enc, docs, fits, pieces, scores


def evidence_of(docs, passage: Passage) -> list[tuple[int, int, int]]:
    """The selected blocks as (char start, char end, block) spans, as the reranker reports evidence."""
    return [(*docs[passage.doc].char_span(int(a), int(b)), int(k))
            for a, b, k in zip(passage.starts, passage.ends, passage.pieces) if b > a]


def run(args) -> dict:
    base = Settings(model_dir=args.model_dir)
    pipeline = Pipeline.from_model_dir(base)
    variants = {name: base.with_overrides(**overrides) for name, overrides in VARIANTS.items()
                if not args.variants or name in args.variants}
    queries = tasks.build("qmsum", args.data_dir, pipeline.tokenizer, split="train", seed=args.seed,
                          max_queries=args.max_queries)
    model_qids = {q.qid for q in subsample(queries, args.model_queries, args.seed)} if args.model_queries else set()
    scorer = None
    if model_qids:
        from keyrank.scoring.local import LocalScorer

        onnx = Path(args.model_dir) / "triton-embedded" / "cross_encoder" / "1" / "model.onnx"
        scorer = LocalScorer(onnx, pad_id=pipeline.template.pad_id, threads=args.threads)
    print(f"qmsum train: {len(queries)} queries, {sum(len(q.candidates) for q in queries)} candidates; "
          f"model-scored sample: {len(model_qids)} queries", file=sys.stderr)

    names = [f"{selector} | {variant}" for selector in args.selectors for variant in variants]
    runs = {name: [] for name in names}
    selected_tokens = {name: [] for name in names}
    select_s = {name: 0.0 for name in names}
    scored, unique = 0, 0
    started = time.perf_counter()
    for query in tqdm(queries, desc="qmsum train", unit="q", disable=args.no_progress):
        query_enc, docs, fits, pieces, scores = block_scores(pipeline, query, args.selectors)
        chosen: dict[str, list[Passage]] = {}
        for selector in args.selectors:
            for variant, settings in variants.items():
                name = f"{selector} | {variant}"
                t0 = time.perf_counter()
                chosen[name] = keyb2_passages(docs, pieces, scores[selector], fits, settings, selector=selector)
                select_s[name] += time.perf_counter() - t0
                selected_tokens[name].extend(p.n_tokens for p in chosen[name])
        logits: dict[tuple, float] = {}
        if query.qid in model_qids:
            # Variants often choose the same blocks for a document: score each distinct input once.
            distinct = {(p.doc, p.starts.tobytes(), p.ends.tobytes()): p for ps in chosen.values() for p in ps}
            keys = list(distinct)
            inputs = pipeline.inputs(query_enc, docs, [distinct[k] for k in keys])
            values = scorer.score_sync(inputs, want_pooled=False).logits
            logits = dict(zip(keys, map(float, values)))
            scored += sum(len(ps) for ps in chosen.values())
            unique += len(keys)
        for name, passages in chosen.items():
            record = QueryRun(qid=query.qid, system=name)
            for cand, passage in zip(query.candidates, passages):
                record.evidence[cand.doc_id] = evidence_of(docs, passage)
                if logits:
                    record.scores[cand.doc_id] = logits[(passage.doc, passage.starts.tobytes(), passage.ends.tobytes())]
            runs[name].append(record)
    elapsed = time.perf_counter() - started

    model_queries = [q for q in queries if q.qid in model_qids]
    rows = []
    for name in names:
        evidence = report.evidence_stats(queries, runs[name])
        row = {"system": name, "evidence_recall": evidence["recall"], "evidence_hit": evidence["hit"],
               "relevant_segments": evidence["documents"], "selected_tokens": float(np.mean(selected_tokens[name])),
               "select_ms_per_query": 1e3 * select_s[name] / len(queries)}
        if model_queries:
            sample = [r for r in runs[name] if r.qid in model_qids]
            values = report.per_query(model_queries, sample, ("nDCG@10", "RR@10"))
            row["ndcg@10"] = float(np.mean([v["nDCG@10"] for v in values.values()]))
            row["rr@10"] = float(np.mean([v["RR@10"] for v in values.values()]))
            row["sample_evidence_recall"] = report.evidence_stats(model_queries, sample)["recall"]
            row["per_query_ndcg"] = {qid: v["nDCG@10"] for qid, v in values.items()}
        rows.append(row)
    return {"queries": len(queries), "model_queries": len(model_queries), "rows": rows, "elapsed_s": elapsed,
            "sequences_scored": scored, "distinct_sequences_scored": unique,
            "random_ndcg@10": report.random_level(model_queries, ("nDCG@10",), seed=args.seed)["metrics"]["nDCG@10"]
            if model_queries else None}


def markdown(result: dict, command: str) -> str:
    """The table docs/SELECTION.md shows: one row per selector x variant."""
    has_model = result["model_queries"] > 0
    head = ["selector", "variant", "evidence recall", "evidence hit", "tokens read"]
    if has_model:
        head += [f"nDCG@10 (n={result['model_queries']})", "MRR@10", "Δ nDCG vs plain ± s.e.", "wins/losses", "recall on sample"]
    lines = [f"`{command}`", "",
             f"QMSum **train**: {result['queries']} queries, evidence over "
             f"{result['rows'][0]['relevant_segments']} relevant segments"
             + (f"; nDCG on a stratified sample of {result['model_queries']} queries "
                f"(random ordering: {result['random_ndcg@10']:.3f}); {result['distinct_sequences_scored']} distinct "
                f"sequences scored for {result['sequences_scored']} assembled" if has_model else "")
             + f"; {result['elapsed_s']:.0f} s.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    plain = {r["system"].split(" | ")[0]: r for r in result["rows"] if r["system"].endswith("| plain (paper480)")}
    for r in result["rows"]:
        selector, variant = r["system"].split(" | ")
        cells = [selector, variant, f"{r['evidence_recall']:.3f}", f"{r['evidence_hit']:.3f}", f"{r['selected_tokens']:.0f}"]
        if has_model:
            cells += [f"{r['ndcg@10']:.3f}", f"{r['rr@10']:.3f}", *paired(r, plain.get(selector)), f"{r['sample_evidence_recall']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired(row: dict, base: dict | None) -> list[str]:
    """Per-query nDCG@10 difference to the selector's plain variant: mean ± standard error, wins/losses."""
    if base is None:
        return ["-", "-"]
    diffs = np.array([row["per_query_ndcg"][q] - base["per_query_ndcg"][q] for q in base["per_query_ndcg"]])
    se = diffs.std(ddof=1) / np.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return [f"{diffs.mean():+.3f} ± {se:.3f}", f"{(diffs > 1e-9).sum()}/{(diffs < -1e-9).sum()}"]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, default=Path("models"), help="output of `keyrank prepare` (with the bi-encoder)")
    p.add_argument("--data-dir", type=Path, default=Settings().eval_data_dir, help="folder holding qmsum/train")
    p.add_argument("--selectors", nargs="+", default=list(SELECTORS), choices=SELECTORS)
    p.add_argument("--variants", nargs="*", default=None, help=f"subset of: {'; '.join(VARIANTS)}")
    p.add_argument("--max-queries", type=int, default=None, help="evidence recall on at most this many train queries (default all)")
    p.add_argument("--model-queries", type=int, default=0, help="train queries also ranked by the cross-encoder (nDCG@10)")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads for the cross-encoder (0 = all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/selection"))
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    command = "python docs/experiments/selection_ablation.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "selection.json").write_text(json.dumps({"command": command, **result}, indent=2))
    table = markdown(result, command)
    (args.out / "selection.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
