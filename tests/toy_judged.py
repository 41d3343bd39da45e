"""A toy judged data set for training tests: the answer sits past token 512, where only keyb2 reads it,
and a tiny BERT (tests/families.py) without dropout that learns it in a few dozen steps."""

from __future__ import annotations

import json
import random
from pathlib import Path

from families import build_family

# Each query's answer; the relevant document holds it (a few times, one block's worth) only after
# ~600 filler tokens, so FirstP never reads it while BM25 selects it for keyb2.
NEEDLES = (
    ("where is the capital of france", "Paris is the capital of France."),
    ("at what temperature does water boil", "Water boils at 100 degrees Celsius at sea level."),
    ("how do i reset my password", "Open the settings page and choose Forgot password to reset it."),
    ("what does photosynthesis convert", "Photosynthesis converts light energy into chemical energy."),
)
FILLER = (
    "The quick brown fox jumps over the lazy dog.", "Dogs are loyal animals that people keep as pets.",
    "Search engines rank documents by relevance.", "The price rose by 3.5% to $1,250 - a record.",
    "Who wrote the book? When did the war end?", "A cat is a small mammal with soft fur.",
)
QUERIES = 12
DOCS_PER_QUERY = 4


def toy_trec(folder: Path) -> tuple[Path, Path, Path]:
    """qrels, docs.jsonl, queries.tsv: one relevant document (answer past token 512) and three without."""
    rng = random.Random(0)
    filler = lambda n: " ".join(rng.choice(FILLER) for _ in range(n))
    docs, qrels, queries = [], [], []
    for q in range(QUERIES):
        query, needle = NEEDLES[q % len(NEEDLES)]
        queries.append(f"q{q}\t{query}")
        for d in range(DOCS_PER_QUERY):
            middle = " ".join([needle] * 12) if d == 0 else filler(12)
            docs.append(json.dumps({"id": f"q{q}-d{d}", "text": f"{filler(60)} {middle} {filler(10)}"}))
            qrels.append(f"q{q} 0 q{q}-d{d} {int(d == 0)}")
    paths = folder / "qrels.txt", folder / "docs.jsonl", folder / "queries.tsv"
    for path, lines in zip(paths, (qrels, docs, queries)):
        path.write_text("\n".join(lines) + "\n")
    return paths


def tiny_bert(folder: Path) -> Path:
    """The families' tiny BERT without dropout: a toy task should learn in a few dozen steps."""
    path = build_family("bert", folder)
    config = json.loads((path / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (path / "config.json").write_text(json.dumps(config))
    return path
