"""What training computes once with the base model and keeps on disk.

- Teacher scores: the teacher's score of every candidate (the base model's
  MaxP by default), from the served path itself (``Reranker.local`` on its
  ONNX export, or ``Reranker.torch`` on its GPU variant; the same code as a
  /rerank with that strategy), for distillation.
- Pooled vectors: with a frozen encoder, PARADE's aggregator only ever reads
  the windows' pooled vectors, so they are computed once (ONNX Runtime, the
  served graph) and the aggregator trains on them in seconds.

Files are named by the base model's fingerprint (from its manifest) and the
settings that shape the inputs, so a changed model or setting never reads a
stale cache; an interrupted fill resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from keyrank.strategies import REGISTRY
from keyrank.data.judged import JudgedQuery
from keyrank.training.planned import PlannedQuery


def shaping(settings: dict, strategy: str) -> dict:
    """The settings ``strategy``'s model inputs depend on (its cut's ``input_settings``): all of them for keyb2,
    none of keyb2's selection settings for a windows strategy, so a student's keyb2 setting
    (``--set keyb2_passes=2``) reads the windows teacher's cache instead of scoring every candidate again."""
    return REGISTRY[strategy].cut.input_settings(settings)


def cache_key(fingerprint: str, settings: dict, what: str) -> str:
    """``<what>-<model fingerprint>-<settings hash>``."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{what}-{fingerprint}-{digest}"


class TeacherScores:
    """The teacher's scores per (query, candidate) (the base model's MaxP by default), one JSON line per query."""

    def __init__(self, path: Path):
        self.path = Path(path)
        """The JSONL file (appended to as queries are scored)."""
        self.scores: dict[str, dict[str, float]] = {}
        """qid -> {doc_id: score}."""
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    self.scores[row["qid"]] = row["scores"]

    def fill(self, serve, queries: Sequence[JudgedQuery], *, strategy: str = "maxp", progress: bool = True,
             close: bool = False) -> None:
        """Score the queries not yet cached with the reranker ``serve()`` gives (built only then);
        ``close`` it afterwards when it is the caller's to end."""
        missing = [q for q in queries if q.qid not in self.scores]
        if not missing:
            return
        reranker = serve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.path.open("a", encoding="utf-8") as f:
                for q in tqdm(missing, desc=f"teacher {strategy}", unit="q", disable=not progress):
                    ranking = reranker.rank(q.query, list(q.texts), strategy=strategy, timeout_s=3600.0)
                    scores = {q.doc_ids[r.index]: float(r.score) for r in ranking.results}
                    self.scores[q.qid] = scores
                    f.write(json.dumps({"qid": q.qid, "scores": scores}) + "\n")
                    f.flush()
        finally:
            if close:
                reranker.close()

    def of(self, judged: JudgedQuery, docs: Sequence[int]) -> np.ndarray:
        """float32 [len(docs)] teacher scores of some candidates of a query."""
        row = self.scores[judged.qid]
        return np.asarray([row[judged.doc_ids[d]] for d in docs], dtype=np.float32)


class PooledVectors:
    """The frozen encoder's pooled vector of every sequence of every planned query (one .npy each)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        """One ``<sha1(qid)>.npy`` float32 [S, H] per query."""
        self.vectors: dict[str, np.ndarray] = {}
        """qid -> [S, H], in the planned query's sequence order."""

    def _path(self, qid: str) -> Path:
        return self.folder / f"{hashlib.sha1(qid.encode()).hexdigest()}.npy"

    def fill(self, scorer, queries: Sequence[PlannedQuery], *, progress: bool = True) -> None:
        """Load what is on disk; score the rest with ``scorer`` (a LocalScorer: the served graph)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for planned in tqdm(queries, desc="pooled vectors", unit="q", disable=not progress):
            path = self._path(planned.judged.qid)
            if path.exists():
                vectors = np.load(path)
            else:
                vectors = scorer.score_sync(planned.model_inputs(), want_pooled=True).pooled.astype(np.float32)
                tmp = path.with_suffix(".tmp.npy")
                np.save(tmp, vectors)
                tmp.replace(path)
            self.vectors[planned.judged.qid] = vectors

    def of(self, planned: PlannedQuery, docs: Sequence[int]) -> np.ndarray:
        """[S', H] pooled vectors of the sequences of ``docs``, in ``planned.model_inputs(docs)`` order."""
        rows = [s for d in docs for s in planned.sequences(d)]
        return self.vectors[planned.judged.qid][rows]
