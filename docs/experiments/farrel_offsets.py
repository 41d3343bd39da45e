"""Where far-relevant offsets differ: what keyb2 read of the relevant insert, per offset.

    python docs/experiments/farrel_offsets.py runs/e/r2-farrel-c5 [--system keyb2-bm25] [--seam] [--first-terms]

Reads a `keyrank eval --task farrel` folder (its config.json for the seed,
constructions and offsets, runs/farrel.json for the scores and evidence),
rebuilds the same queries, and prints per offset: nDCG@10 of the system, the
share of the target's insert inside its selected blocks, the share of the
insert's first 100 characters read, nDCG@10 over the rankings where those are
read, the characters selected outside the insert in the target document, and
the share of rankings where the insert opens a CogLTX block (its first token
starts one, as it always does at offset 0) with nDCG@10 over those and the others.
``--first-terms``: instead, where each insert's first rare query term sits (``Pipeline.anchors``' terms,
counted in tokens from the insert's start; keyb2-blocks' lead rule starts an input 4 tokens before it):
per offset, nDCG@10 over the rankings whose target has it within the lead and over the others, and among
the distractors that outscore the target, the share whose first rare term lies past the lead.
``--seam``: the run was taken with docs/experiments/farrel_seam.py (the insert at a
filler-passage boundary), so the queries are rebuilt that way.
docs/EXPERIMENTS.md (2026-11-26, two epochs and PSI's noise) reads the table.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from keyrank import segment
from keyrank.config import Settings
from keyrank.data import farrelevant
from keyrank.evaluation import tasks
from keyrank.evaluation.report import covered_share
from keyrank.tokenize import TextTokenizer

HEAD_CHARS = 100


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="folder `keyrank eval --task farrel --out` wrote")
    p.add_argument("--system", default="keyb2-bm25")
    p.add_argument("--data-dir", type=Path, default=Path("../shared/datasets"))
    p.add_argument("--seam", action="store_true", help="the run was taken with farrel_seam.py")
    p.add_argument("--first-terms", action="store_true", help="where the inserts' first rare query terms sit")
    args = p.parse_args()
    if args.seam:
        import farrel_seam  # noqa: PLC0415 (beside this file)
        farrelevant.insert, farrelevant.check_offsets = farrel_seam.insert_at_boundary, farrel_seam.check_at_boundary
    config = json.loads((args.run / "config.json").read_text())
    tokenizer = TextTokenizer.from_file(Path(config["model_dir"]) / "gateway" / "tokenizer.json")
    vocab_costs = segment.token_break_costs(tokenizer)
    settings = Settings()  # the block settings the run was taken with (defaults, or the same environment)
    queries = {q.qid: q for q in tasks.build(
        "farrel", args.data_dir, tokenizer, seed=config["seed"], max_queries=config["max_queries"],
        offsets=tuple(config["offsets"]), distractors=config["distractors"], filler=config["filler"],
        dl20_topics=config["dl20_topics"], constructions=config.get("constructions", 1))}
    saved = json.loads((args.run / "runs" / "farrel.json").read_text())
    ndcg = saved["per_query"][args.system]  # ir-measures' values, as the report computed them
    if args.first_terms:
        first_terms(queries, saved["runs"][args.system], ndcg, tokenizer, settings.keyb2_blocks_lead or 0)
        return
    rows = defaultdict(lambda: defaultdict(list))
    for run in saved["runs"][args.system]:
        q = queries[run["qid"]]
        target = next(iter(q.qrels))
        start, end = q.meta["inserts"][target]
        spans = run["evidence"].get(target, [])
        covered = covered_share([(start, end)], spans)
        row = rows[q.bucket]
        row["ndcg"].append(ndcg[run["qid"]]["nDCG@10"])
        row["covered"].append(covered)
        row["head"].append(covered_share([(start, min(end, start + HEAD_CHARS))], spans))
        row["outside"].append(sum(span[1] - span[0] for span in spans) - covered * (end - start))
        doc = next(c for c in q.candidates if c.doc_id == target)
        enc = tokenizer.encode_documents([doc.text])[0]
        blocks = segment.blocks(enc, vocab_costs, settings.block_max_tokens, settings.block_cost)
        row["opens"].append(bool(np.any(enc.offsets[blocks.starts, 0] == start)))
    print(f"{args.system}, {args.run}\n")
    print("| offset | rankings | nDCG@10 | insert covered | its first 100 characters read | nDCG@10 when they are read "
          "| characters read outside the insert | insert opens a block | nDCG@10 then / otherwise |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for bucket in sorted(rows, key=int):
        r = rows[bucket]
        read = [n for n, h in zip(r["ndcg"], r["head"]) if h > 0.99]
        opens = np.asarray(r["opens"])
        ndcg_q = np.asarray(r["ndcg"])
        split = " / ".join(f"{ndcg_q[m].mean():.3f}" if m.any() else "-" for m in (opens, ~opens))
        print(f"| {bucket} | {len(r['ndcg'])} | {np.mean(r['ndcg']):.3f} | {np.mean(r['covered']):.3f} | "
              f"{np.mean(r['head']):.3f} | {np.mean(read) if read else float('nan'):.3f} | {np.mean(r['outside']):.0f} | "
              f"{opens.mean():.2f} | {split} |")


def first_terms(queries, runs, ndcg, tokenizer, lead: int) -> None:
    """The ``--first-terms`` table (module doc)."""
    from keyrank.pipeline import rare_terms  # noqa: PLC0415
    from keyrank.select.bm25 import term_mask  # noqa: PLC0415

    is_term = term_mask(tokenizer)

    def first_rare(q, doc_id, terms) -> int:
        start, end = q.meta["inserts"][doc_id]
        text = next(c for c in q.candidates if c.doc_id == doc_id).text[start:end]
        hits = np.flatnonzero(np.isin(tokenizer.encode_documents([text])[0].ids, terms))
        return int(hits[0]) if hits.size else -1

    rows = defaultdict(lambda: defaultdict(list))
    for run in runs:
        q = queries[run["qid"]]
        target, scores = next(iter(q.qrels)), run["scores"]
        terms = rare_terms(tokenizer.encode_query(q.query, 64).ids, is_term, tokenizer)
        row = rows[q.bucket]
        row["near" if 0 <= first_rare(q, target, terms) <= lead else "far"].append(ndcg[run["qid"]]["nDCG@10"])
        for c in q.candidates:
            if c.doc_id != target:
                past = first_rare(q, c.doc_id, terms) > lead
                row["distractors"].append(past)
                if scores[c.doc_id] > scores[target]:
                    row["above"].append(past)
    print(f"| offset | rankings | target's first rare term within {lead} tokens: share, nDCG@10 | otherwise: nDCG@10 "
          f"| distractors above the target: how many, share with it past {lead} | all distractors: that share |")
    print("| --- | --- | --- | --- | --- | --- |")
    for bucket in sorted(rows, key=int):
        r = rows[bucket]
        n = len(r["near"]) + len(r["far"])
        far = f"{np.mean(r['far']):.3f}" if r["far"] else "-"
        above = f"{len(r['above'])}, {np.mean(r['above']):.2f}" if r["above"] else "0, -"
        print(f"| {bucket} | {n} | {len(r['near']) / n:.2f}, {np.mean(r['near']):.3f} | {far} | {above} | "
              f"{np.mean(r['distractors']):.2f} |")


if __name__ == "__main__":
    main()
