"""``keyrank finetune``: the command line of ``keyrank.training.finetune``.

    keyrank finetune --model ../shared/models/ce-minilm-l6 --out runs/ce-keyb2 \\
        --strategy keyb2 --selector bm25 --task qmsum farrel
    keyrank finetune --model my-reranker/ --out runs/mine --qrels q.txt --docs docs.jsonl --queries q.tsv
    keyrank finetune --model ../shared/models/ce-minilm-l6 --out runs/parade-attn \\
        --strategy parade-attn --task qmsum --install-into models

docs/TRAINING.md has the recipe, the splits and measured runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from keyrank.cli_format import DefaultsHelpFormatter
from keyrank.data.judged import add_trec_arguments, trec_files
from keyrank.strategies import STRATEGIES
from keyrank.training.planned import TRAINABLE
from keyrank.training.recipe import LOSSES, READERS, FinetuneConfig
from keyrank.training.splits import TASKS


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


def _served_strategy(fallback: str) -> str:
    """The strategy the service serves by default (KEYRANK_DEFAULT_STRATEGY), when it is one finetune trains."""
    from keyrank.config import BadSetting, get_settings

    try:
        served = get_settings().default_strategy
    except BadSetting:  # said by the command itself when it runs
        return fallback
    return served if served in TRAINABLE else fallback


def parser() -> argparse.ArgumentParser:
    d = FinetuneConfig(model="", out=Path())
    p = argparse.ArgumentParser(prog="keyrank finetune", description=__doc__.split("\n\n")[0],
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("--model", required=True, help="starting checkpoint: Hugging Face folder or hub id (required)")
    p.add_argument("--out", type=Path, required=True, help="run folder (keep it outside git, e.g. runs/...) (required)")
    p.add_argument("--strategy", choices=TRAINABLE, default=_served_strategy(d.strategy),
                   help="what is trained: the scorer for keyb2/keyb2-blocks/maxp/firstp, the aggregator for parade-* and keyb2-blocks-attn, "
                        "the head (and the graph's learned part) for cedr-knrm/cedr-drmm/cedr-pacrr/model1, encoder frozen; "
                        "by default the strategy the service serves (KEYRANK_DEFAULT_STRATEGY)")
    p.add_argument("--readers", nargs="+", default=list(READERS), metavar="STRATEGY",
                   help="after training, rank the dev queries with the new scorer by each of these and write the best one as "
                        "its serving settings (keyrank-serving.env beside the checkpoint, gateway/serving.env of out/prepared), "
                        "which `keyrank prepare` carries and `keyrank serve` reads; 'none' = measure none, write none")
    p.add_argument("--selector", default=d.selector, help="keyb2's block selector, as served")
    p.add_argument("--mix", choices=TRAINABLE, default=d.mix,
                   help="a second scorer strategy whose inputs of the same groups also train the scorer every step (e.g. keyb2 "
                        "beside keyb2-blocks: long and short inputs); dev reads --strategy; unset = --strategy's inputs alone")
    p.add_argument("--mix-weight", type=float, default=d.mix_weight, help="weight of the --mix strategy's loss")
    data = p.add_argument_group("data (any mix; at least one --task or the three TREC files)")
    data.add_argument("--task", nargs="+", choices=TASKS, default=[],
                      help="qmsum: QMSum train meetings; farrel: far-relevant on the DL20 train topics; "
                           "squad-far: SQuAD contexts inserted deep into other articles (the train half of the articles)")
    data.add_argument("--data-dir", type=Path, default=d.data_dir,
                      help="folder of qmsum/ and trec-dl20-passage/ for --task (KEYRANK_EVAL_DATA_DIR)")
    data.add_argument("--farrel-seeds", type=_ints, default=d.farrel_seeds, help="far-relevant constructions per topic, e.g. 0,1,2")
    data.add_argument("--farrel-offsets", type=_ints, default=d.farrel_offsets,
                      help="token offsets of the relevant insert in far-relevant documents, e.g. 0,512,1024")
    add_trec_arguments(data)
    data.add_argument("--max-queries", type=int, default=None, help="seeded subset of the training queries; None = all")
    train = p.add_argument_group("training")
    train.add_argument("--loss", choices=LOSSES, default=d.loss, help="listwise: softmax CE over a group; hinge: KeyB's pairwise")
    train.add_argument("--margin", type=float, default=d.margin, help="hinge margin")
    train.add_argument("--negatives", type=int, default=d.negatives, help="non-relevant documents sampled per group")
    train.add_argument("--distill", type=float, default=d.distill, help="weight of distillation from the teacher's scores (0 = off)")
    train.add_argument("--teacher", type=Path, default=d.teacher,
                       help="a prepared model folder (keyrank prepare --out) whose scores teach; unset = the base model")
    train.add_argument("--teacher-strategy", choices=STRATEGIES, default=d.teacher_strategy,
                       help="how the teacher reads each candidate (the student reads what --strategy reads)")
    train.add_argument("--teacher-runtime", choices=("auto", "onnx", "torch"), default=d.teacher_runtime,
                       help="onnx: the teacher's CPU variant; torch: its GPU variant (keyrank prepare --device cuda) on --device; auto: torch on cuda")
    train.add_argument("--temperature", type=float, default=d.temperature, help="softmax temperature of the distillation term")
    train.add_argument("--epochs", type=int, default=d.epochs, help="passes over the training queries")
    train.add_argument("--max-groups", type=int, default=d.max_groups, help="groups per epoch at most; None = every trainable query once")
    train.add_argument("--groups-per-step", type=int, default=d.groups_per_step, help="groups per optimizer step (gradient accumulation)")
    train.add_argument("--sequences-per-forward", type=int, default=d.sequences_per_forward,
                       help="most sequences in one forward pass (memory)")
    train.add_argument("--lr", type=float, default=d.lr, help="encoder learning rate (AdamW)")
    train.add_argument("--aggregator-lr", type=float, default=None, help="PARADE aggregator learning rate; None = 1e-3 Attn, 1e-4 Transformer")
    train.add_argument("--warmup", type=float, default=d.warmup, help="share of steps with a linear warm-up, then linear decay to 0")
    train.add_argument("--attention-dropout", type=float, default=d.attention_dropout, help="attention dropout while training (-1 = the checkpoint's)")
    train.add_argument("--train-encoder", action="store_true", help="PARADE: train the cross-encoder too (else frozen, cached pooled vectors)")
    train.add_argument("--cache-dir", type=Path, default=None, help="teacher scores / pooled vectors, shareable between runs; None = out/cache")
    train.add_argument("--seed", type=int, default=d.seed, help="seeds sampling, dropout and initialisation")
    train.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="optimizer steps between resumable checkpoints")
    train.add_argument("--stop-after-steps", type=int, default=None, help="end after N steps (state saved), run again to continue; None = run to the end")
    train.add_argument("--restart", action="store_true", help="ignore out/state/latest.pt and start over")
    train.add_argument("--dev-max-queries", type=int, default=d.dev_max_queries, help="dev queries scored after each epoch; None = all")
    train.add_argument("--readers-max-queries", type=int, default=d.readers_max_queries,
                       help="dev queries the --readers are measured on; None = every dev query")
    train.add_argument("--threads", type=int, default=None, help="torch CPU threads; None = the cores this process may use")
    train.add_argument("--device", choices=("cpu", "cuda"), default=None, help="where to train; None = cuda when available")
    train.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                       help="pipeline setting (as KEYRANK_<NAME>), e.g. --set keyb2_budget_tokens=480; serve with the same")
    p.add_argument("--install-into", type=Path, default=None,
                   help="PARADE, CEDR: copy the trained aggregator or head (and its interaction graph) into this prepared "
                        "model dir's gateway/; None = leave them in out/")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def config_from(args: argparse.Namespace) -> FinetuneConfig:
    trec = trec_files(args, "keyrank finetune")
    settings = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set wants NAME=VALUE, got {item!r}")
        try:  # numbers, true/false, lists as JSON; anything else as the string pydantic will validate
            settings[name] = json.loads(value)
        except ValueError:
            settings[name] = value
    return FinetuneConfig(
        model=args.model, out=args.out, strategy=args.strategy, mix=args.mix, mix_weight=args.mix_weight, selector=args.selector, tasks=tuple(args.task), trec=trec,
        data_dir=args.data_dir, farrel_seeds=args.farrel_seeds, farrel_offsets=args.farrel_offsets, max_queries=args.max_queries,
        loss=args.loss, margin=args.margin, negatives=args.negatives, distill=args.distill, temperature=args.temperature,
        teacher=args.teacher, teacher_strategy=args.teacher_strategy, teacher_runtime=args.teacher_runtime,
        epochs=args.epochs, max_groups=args.max_groups, groups_per_step=args.groups_per_step,
        sequences_per_forward=args.sequences_per_forward, lr=args.lr, aggregator_lr=args.aggregator_lr, warmup=args.warmup,
        cache_dir=args.cache_dir, attention_dropout=None if args.attention_dropout < 0 else args.attention_dropout,
        freeze_encoder=not args.train_encoder, seed=args.seed, checkpoint_every=args.checkpoint_every,
        stop_after_steps=args.stop_after_steps, resume=not args.restart,
        dev_max_queries=args.dev_max_queries, readers_max_queries=args.readers_max_queries, threads=args.threads, device=args.device, progress=not args.no_progress,
        settings=settings, readers=_readers(args.readers),
    )


def _readers(names: list[str]) -> tuple[str, ...]:
    """``--readers``: strategy names (commas allowed), or none."""
    chosen = tuple(n for value in names for n in value.split(",") if n)
    if chosen in ((), ("none",)):
        return ()
    unknown = [n for n in chosen if n not in STRATEGIES]
    if unknown:
        raise SystemExit(f"keyrank finetune: --readers: unknown strategy {', '.join(unknown)} (one of {', '.join(STRATEGIES)})")
    return chosen


def install_aggregator(path: Path, model_dir: Path) -> Path:
    """Copy a trained aggregator (and the interaction graph an interaction head reads, written beside it) into
    ``model_dir/gateway/`` after checking it was trained on that encoder."""
    from keyrank.aggregators import TrainedAggregator
    from keyrank.strategies import REGISTRY

    manifest = json.loads((Path(model_dir) / "gateway" / "manifest.json").read_text())
    served = manifest["cross_encoder"]["fingerprint"]
    meta = TrainedAggregator.load(path).meta
    trained_on = meta.get("encoder_fingerprint")
    if trained_on != served:
        raise SystemExit(f"{path} was trained on encoder {trained_on}, but {model_dir} serves {served}: prepare the matching model first")
    spec = REGISTRY.get(str(meta.get("kind")))
    for part in (spec.trained_parts if spec is not None else ()):
        if part != Path(path).name:
            shutil.copyfile(Path(path).parent / part, Path(model_dir) / "gateway" / part)
    if spec is not None and spec.features is not None:  # and as a model of its Triton repositories
        from keyrank.prepare.interaction import write_triton_models

        write_triton_models(model_dir, Path(model_dir) / "gateway" / spec.features)
    target = Path(model_dir) / "gateway" / Path(path).name
    shutil.copyfile(path, target)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from keyrank.errors import KeyrankError
    from keyrank.training.loop import finetune

    try:
        result = finetune(config_from(args))
    except (KeyrankError, ValueError) as exc:  # a model that cannot be fetched or exported, data that cannot be read
        print(f"keyrank finetune: {exc}", file=sys.stderr)
        return 1
    if not result.finished:
        print(f"stopped early as asked; run the same command again to continue from {result.out / 'state'}", file=sys.stderr)
    print(json.dumps({"out": str(result.out), "model_dir": str(result.model_dir) if result.model_dir else None,
                      "aggregator": str(result.aggregator) if result.aggregator else None, "dev_before": result.dev_before,
                      "history": result.history, "best_epoch": result.best_epoch, "readers": result.readers}, indent=2))
    if result.readers:
        from keyrank.training.readers import markdown

        print(markdown(result.readers) + f"\n\nserved by default: {result.readers['best']} (written to "
              f"{result.model_dir}/keyrank-serving.env and {result.out}/prepared/gateway/serving.env)", file=sys.stderr)
    if args.install_into is not None:
        if result.aggregator is None:
            print("--install-into: this run trained no aggregator", file=sys.stderr)
            return 2
        print(f"installed {install_aggregator(result.aggregator, args.install_into)}", file=sys.stderr)
    return 0
