"""The quality gate every CPU variant passes at prepare time (variants.py builds them).

The gate scores real pairs (``gate_groups``: DL20 passages and 512-token QMSum train chunks from the
judged data, ``--gate-datasets``, when present, else the export's built-in check pairs) with the fp32
reference and the variant and compares, per query, the rankings (Kendall tau, same top document) and the
scores (max absolute difference). A variant that fails is refused with its numbers (``VariantRefused``);
nothing serves it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from keyrank.errors import KeyrankError

EXACT = frozenset({"fp32", "fused", "openvino"})
"""Variants that compute the same function: held to the export's ``atol`` on every score."""
GATE_VERSION = 1
"""Bump when the gate's pairs or thresholds change, so prepared variants are re-checked."""
MIN_KENDALL_TAU = 0.95
"""Approximate (int8) variants: the lowest accepted mean per-query Kendall tau against fp32."""
MIN_TOP1_AGREEMENT = 1.0
"""Approximate variants: share of queries whose top document must stay the same."""


class VariantRefused(KeyrankError):
    """A CPU variant failed the quality gate: its numbers are in the message and in ``report``."""

    def __init__(self, message: str, report: dict) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class GateGroup:
    """One query and its candidates, framed as the gateway frames them (firstp cut), padded to one width."""

    name: str
    feeds: dict[str, np.ndarray]



def gate_groups(datasets: Path | None, text_tokenizer, template, *, dl20_queries: int = 8, dl20_passages: int = 16,
                qmsum_queries: int = 3, qmsum_chunks: int = 6) -> tuple[list[GateGroup], str]:
    """The gate's pairs and where they came from: DL20 BM25 passages (short) and QMSum *train* chunks of
    ~512 tokens (long) when ``datasets`` holds them (never val/test: the gate chooses), else the export's
    built-in check pairs as one group (real text, but only 5 pairs: a weak gate, said in the manifest)."""
    groups: list[GateGroup] = []
    if datasets is not None and (datasets / "trec-dl20-passage" / "bm25_dl20.json").exists():
        data = json.loads((datasets / "trec-dl20-passage" / "bm25_dl20.json").read_text())
        for row in data[:dl20_queries]:
            docs = [hit["content"] for hit in row["hits"][:dl20_passages]]
            groups.append(GateGroup(f"dl20:{row['hits'][0]['qid']}", _feeds(text_tokenizer, template, row["query"], docs)))
    qmsum = sorted((datasets / "qmsum" / "train").glob("*.json")) if datasets is not None else []
    for path in qmsum[:qmsum_queries]:
        meeting = json.loads(path.read_text())
        if not meeting.get("specific_query_list"):
            continue
        text = "\n".join(f"{t['speaker']}: {t['content']}" for t in meeting["meeting_transcripts"])
        (enc,) = text_tokenizer.encode_documents([text])
        chunks = [enc.text[slice(*enc.char_span(s, s + 500))] for s in range(0, len(enc) - 500, 500)][:qmsum_chunks]
        query = meeting["specific_query_list"][0]["query"]
        groups.append(GateGroup(f"qmsum:{path.stem}", _feeds(text_tokenizer, template, query, chunks)))
    if groups:
        return groups, (f"{datasets}: {sum(g.name.startswith('dl20') for g in groups)} DL20 queries x "
                        f"{dl20_passages} BM25 passages, {sum(g.name.startswith('qmsum') for g in groups)} QMSum train "
                        f"queries x {qmsum_chunks} chunks of 500 tokens")
    from keyrank.prepare.cross_encoder import CHECK_PAIRS

    docs = [doc for _, doc in CHECK_PAIRS]
    builtin = [GateGroup(f"builtin:{i}", _feeds(text_tokenizer, template, query, docs)) for i, (query, _) in enumerate(CHECK_PAIRS)]
    return builtin, f"built-in: the export's {len(CHECK_PAIRS)} check queries x its {len(docs)} passages (no datasets found)"


def _feeds(text_tokenizer, template, query: str, docs: list[str]) -> dict[str, np.ndarray]:
    from keyrank.prepare.cross_encoder import template_batch

    ids, mask, types = (t.numpy() for t in template_batch(text_tokenizer, template, [(query, d) for d in docs]))
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def scores(path: Path, groups: list[GateGroup], threads: int = 0, runtime: dict | None = None) -> list[np.ndarray]:
    """The logits of every group under one session, opened as the served model is (``runtime``)."""
    from keyrank.scoring.local import open_session

    session, names, _ = open_session(path, threads=threads, runtime=runtime)
    out = []
    for group in groups:
        chunk = [session.run(["logits"], {k: v[i:i + 8] for k, v in group.feeds.items() if k in names})[0]
                 for i in range(0, len(group.feeds["input_ids"]), 8)]
        out.append(np.concatenate(chunk)[:, 0].astype(np.float64))
    return out


def compare(reference: list[np.ndarray], candidate: list[np.ndarray]) -> dict:
    """Per-query ranking agreement and score difference of a variant against the fp32 reference."""
    from scipy.stats import kendalltau

    taus = [float(kendalltau(a, b).statistic) for a, b in zip(reference, candidate)]
    top1 = [int(np.argmax(a) == np.argmax(b)) for a, b in zip(reference, candidate)]
    return {
        "queries": len(reference),
        "pairs": int(sum(len(a) for a in reference)),
        "kendall_tau_mean": round(float(np.mean(taus)), 4),
        "kendall_tau_min": round(float(np.min(taus)), 4),
        "top1_agreement": round(float(np.mean(top1)), 4),
        "max_abs_diff": float(max(np.max(np.abs(a - b)) for a, b in zip(reference, candidate))),
    }


def verdict(variant: str, numbers: dict, atol: float) -> str | None:
    """Why ``variant`` fails the gate, or None when it passes."""
    if variant in EXACT:
        if not numbers["max_abs_diff"] <= atol:
            return f"max |score - fp32| {numbers['max_abs_diff']:.3g} > atol {atol:g}"
        return None
    if numbers["max_abs_diff"] <= atol:  # fp32's function within the export's tolerance: near-ties may swap, nothing moved
        return None
    if not numbers["kendall_tau_mean"] >= MIN_KENDALL_TAU:
        return f"mean Kendall tau {numbers['kendall_tau_mean']} < {MIN_KENDALL_TAU}"
    if not numbers["top1_agreement"] >= MIN_TOP1_AGREEMENT:
        return f"top-1 agreement {numbers['top1_agreement']:.0%} < {MIN_TOP1_AGREEMENT:.0%}"
    return None


def check(variant: str, fp32: Path, candidate: Path, groups: list[GateGroup], source: str, atol: float,
          runtime: dict | None = None) -> dict:
    """The gate: numbers and verdict; raises ``VariantRefused`` (with them) when the variant fails.
    ``runtime``: what runs the candidate (ONNX Runtime when None)."""
    numbers = compare(scores(fp32, groups), scores(candidate, groups, runtime=runtime))
    report = {"variant": variant, "gate_version": GATE_VERSION, "pairs_from": source, **numbers}
    reason = verdict(variant, numbers, atol)
    if reason:
        raise VariantRefused(
            f"CPU variant {variant!r} refused by the quality gate: {reason} (Kendall tau mean "
            f"{numbers['kendall_tau_mean']}, min {numbers['kendall_tau_min']}, top-1 agreement "
            f"{numbers['top1_agreement']:.0%}, max |diff| {numbers['max_abs_diff']:.3g} on {numbers['pairs']} pairs "
            f"of {numbers['queries']} queries; pairs: {source})", report,
        )
    return report
