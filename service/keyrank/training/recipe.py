"""What a fine-tuning run is: the model, the data, the strategy, the loss and the schedule.

Defaults follow the recipe that trained ce-minilm-l6 (listwise softmax CE,
AdamW, 10% warm-up then linear decay) at a fine-tuning learning rate, and KeyB's
setting (the selected blocks as one 512-token sequence).
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from keyrank.config import get_settings
from keyrank.data.judged import JudgedQuery, TrecFiles, from_trec
from keyrank.data.splits import DEV_PERCENT
from keyrank.tokenize import TextTokenizer
from keyrank.training import splits

LOSSES = ("listwise", "hinge")
"""Ranking losses ``keyrank finetune --loss`` accepts (losses.py computes them; named here, where the parser
reads them without PyTorch)."""
READERS = ("keyb2-blocks", "keyb2", "maxp", "parade-avg")
"""The readers `keyrank finetune` measures the new scorer with (training/readers.py): the default, its
one-input-per-document sibling, and the windows read whole (max, and PARADE's mean of pooled vectors). The first
wins a tie."""

READERS_FARREL_SEED = 9
"""The far-relevant construction the readers are also measured on when a run trains on far-relevant documents
(``readers_dev``): the train topics built again with this seed (the next one a run does not train with)."""

TREC_DEV_SALT = "keyrank/trec-dev/"
"""Salt of the dev carve-out of TREC-file queries (by query id)."""


@dataclass(frozen=True, slots=True)
class FinetuneConfig:
    """One ``keyrank finetune`` run."""

    model: str
    """Starting checkpoint: a Hugging Face folder or hub id (any reranker ``keyrank prepare`` exports)."""
    out: Path
    """Run folder: model/ (the fine-tuned checkpoint), base/, cache/, state/, training.json."""
    strategy: str = "keyb2"
    """What is trained: keyb2, keyb2-blocks, maxp, firstp (the scorer) or parade-attn, parade-transformer, keyb2-blocks-attn (the aggregator)."""
    mix: str | None = None
    """A second scorer strategy whose inputs of the same groups also train the scorer, every step (keyb2 beside
    keyb2-blocks: one 512-token input and the short block inputs of each document); None = ``strategy``'s alone.
    Dev, and so the epoch kept, reads ``strategy``."""
    mix_weight: float = 1.0
    """Weight of the ``mix`` strategy's loss beside ``strategy``'s."""
    selector: str | None = "bm25"
    """keyb2's block selector, as served (bm25, dense, hybrid, cross; cross selects with the base model)."""
    tasks: tuple[str, ...] = ()
    """Training sets from keyrank.data's constructions: qmsum (train meetings), farrel (train DL20 topics)."""
    trec: TrecFiles | None = None
    """Training set from TREC files."""
    data_dir: Path = field(default_factory=lambda: get_settings().eval_data_dir)
    """Folder of qmsum/, trec-dl20-passage/ and squad2-dev-half/ for ``tasks`` (default: the eval_data_dir setting)."""
    farrel_seeds: tuple[int, ...] = (0,)
    """Far-relevant constructions per train topic (each seed draws other inserts and filler)."""
    farrel_offsets: tuple[int, ...] = (0, 512, 1024, 2048, 3072)
    """Token offsets of the relevant insert in far-relevant training documents."""
    max_queries: int | None = None
    """Keep at most this many training queries (a seeded draw), to bound planning and caches."""
    loss: str = "listwise"
    """``listwise`` (softmax CE, relevant vs sampled negatives) or ``hinge`` (KeyB's pairwise)."""
    margin: float = 1.0
    """Hinge margin."""
    negatives: int = 3
    """Non-relevant documents sampled per group (fewer when the query has fewer)."""
    distill: float = 0.0
    """Weight of distillation from the teacher's scores over a group's documents (0 = off)."""
    temperature: float = 1.0
    """Softmax temperature of the distillation term."""
    teacher: Path | None = None
    """Folder of a prepared model (``keyrank prepare --out``; a fine-tuned one, say) whose scores teach;
    None = the base model being trained."""
    teacher_strategy: str = "maxp"
    """How the teacher reads each candidate: any strategy (it may read the whole document, windows or
    PARADE, while the student reads what ``strategy`` reads)."""
    teacher_runtime: str = "auto"
    """Where the teacher scores: ``onnx`` (its CPU variant, the served path), ``torch`` (its PyTorch
    variant from ``keyrank prepare --device cuda``, on the training device), ``auto`` = torch on cuda."""
    epochs: int = 1
    """Passes over the training queries (one group per query per epoch)."""
    max_groups: int | None = None
    """Groups per epoch at most (None = every trainable query once)."""
    groups_per_step: int = 8
    """Groups per optimizer step (gradient accumulation over forwards)."""
    sequences_per_forward: int = 16
    """Most sequences in one forward pass (memory; a larger group runs alone)."""
    lr: float = 2e-5
    """Encoder learning rate (AdamW)."""
    aggregator_lr: float | None = None
    """PARADE aggregator learning rate (None = 1e-3 for Attn, 1e-4 for Transformer: at 1e-3 its scores
    saturate and the dev metric falls back after the first epoch, measured in docs/TRAINING.md)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    warmup: float = 0.1
    """Share of steps with a linear learning-rate warm-up, then linear decay to 0."""
    max_grad_norm: float = 1.0
    """Gradient clipping."""
    attention_dropout: float | None = 0.0
    """Attention-probability dropout while training (None = the checkpoint's; 0 is ~1.5x faster on CPU)."""
    freeze_encoder: bool | None = None
    """PARADE: keep the cross-encoder fixed and train only the aggregator (None = yes for PARADE)."""
    cache_dir: Path | None = None
    """Where teacher scores and pooled vectors are kept (None = out/cache); runs on one base model may share it."""
    seed: int = 0
    """Seeds sampling, dropout and initialisation; the same seed replays the same run."""
    checkpoint_every: int = 25
    """Optimizer steps between resumable checkpoints (state/latest.pt)."""
    stop_after_steps: int | None = None
    """End this invocation after so many optimizer steps, state saved (time-boxing on a shared machine)."""
    resume: bool = True
    """Continue from state/latest.pt when it exists."""
    dev_max_queries: int | None = 40
    """Dev queries scored after each epoch (a fixed hash-ordered subset; None = all)."""
    readers_max_queries: int | None = None
    """Dev queries the ``readers`` are measured on, in the same order (None = every dev query): what is served rests
    on more queries than the epoch kept, where 24 once chose a reader held-out data put last."""
    readers: tuple[str, ...] = ()
    """After training, the readers whose dev metrics with the new scorer choose how it is served (training/readers.py;
    `keyrank finetune` measures READERS; empty = none measured, no serving settings written)."""
    threads: int | None = None
    """torch CPU threads (None = the cores this process may use)."""
    device: str | None = None
    """``cpu`` or ``cuda`` (None = cuda when available)."""
    progress: bool = True
    """tqdm progress bars."""
    settings: dict = field(default_factory=dict)
    """Pipeline settings overrides (keyb2_budget_tokens, ...); serving must use the same."""

    @property
    def trains_encoder(self) -> bool:
        """Whether the model's graph runs in every step (else only an aggregator trains, on cached vectors). The
        CEDR heads train over the frozen encoder's cached chunk features; Model 1's translation network sits in
        its graph, so its steps run the graph (the encoder in it frozen)."""
        from keyrank.interaction import KINDS, LEARNED_GRAPHS

        if self.strategy in KINDS:
            if self.freeze_encoder is False:
                raise ValueError(f"{self.strategy} trains with the encoder frozen (its graph is exported from the starting "
                                 "checkpoint); fine-tune the scorer first (--strategy maxp) and start from it")
            return self.strategy in LEARNED_GRAPHS
        from keyrank.aggregators import KINDS as AGGREGATORS

        if self.strategy not in AGGREGATORS:
            return True
        return self.freeze_encoder is False

    def to_json(self) -> dict:
        return json.loads(json.dumps(asdict(self), default=str))


def load_judged(config: FinetuneConfig, tokenizer: TextTokenizer) -> tuple[list[JudgedQuery], list[JudgedQuery]]:
    """(train, dev) judged queries of the run's sources; dev is never trained on. Dev is every held-out query that
    can be measured, in a fixed hash order: a run reads its first ``dev_max_queries`` each epoch."""
    train: list[JudgedQuery] = []
    dev: list[JudgedQuery] = []
    for task in config.tasks:
        seeds = config.farrel_seeds if task == "farrel" else (config.seed,)
        for seed in seeds:
            t, d = splits.build(task, config.data_dir, tokenizer, seed=seed, offsets=config.farrel_offsets)
            train += t
            dev += d
    if config.trec is not None:
        f = config.trec
        queries = from_trec(f.qrels, f.docs, f.queries, run_path=f.run, depth=f.depth, relevant_from=f.relevant_from)
        in_dev = lambda q: zlib.crc32((TREC_DEV_SALT + q.group).encode()) % 100 < DEV_PERCENT
        train += [q for q in queries if not in_dev(q)]
        dev += [q for q in queries if in_dev(q)]
    if not train:
        raise ValueError("no training data: name --task qmsum/farrel or give --qrels/--docs/--queries")
    if config.max_queries is not None and len(train) > config.max_queries:
        train = random.Random(config.seed).sample(train, config.max_queries)
    if not any(q.trainable for q in train):
        # Training on it would take 0 steps and hand back the base model as if it were the result.
        raise ValueError(
            f"nothing to train on: none of the {len(train)} training queries has both a relevant and a non-relevant "
            "candidate; give each query judged non-relevant documents (grade 0, or a --run whose unjudged top documents "
            "count as non-relevant), check --relevant-from, or raise --max-queries"
        )
    dev = sorted((q for q in dev if q.trainable), key=lambda q: zlib.crc32(q.qid.encode()))
    return train, dev


def readers_dev(config: FinetuneConfig, tokenizer: TextTokenizer) -> list[JudgedQuery]:
    """Far-relevant documents the readers are measured on beside the dev queries, when the run trains on them: the
    DL20 train topics (the held-back ones are reported, never read) built with other inserts and filler than any
    training construction. The topics are training topics, which flatters every reader alike; what it measures is
    how a reader bears a relevant passage far into a document, which QMSum's dev meetings do not test (PARADE-avg's
    mean of windows reads 0.54 there against keyb2-blocks' 0.86 with the base scorer). Empty for other runs."""
    if "farrel" not in config.tasks:
        return []
    seed = READERS_FARREL_SEED
    while seed in config.farrel_seeds:
        seed += 1
    built, _ = splits.build("farrel", config.data_dir, tokenizer, seed=seed, offsets=config.farrel_offsets)
    return [q for q in built if q.trainable][: config.readers_max_queries]

