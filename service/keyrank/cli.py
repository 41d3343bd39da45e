"""The `keyrank` command: prepare models, serve, evaluate, benchmark."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from keyrank import __version__
from keyrank.cli_format import DefaultsHelpFormatter
from keyrank.config import (
    SERVING_FILE,
    BadSetting,
    Settings,
    bad_setting,
    environment_settings,
    get_settings,
    serving_defaults,
    serving_warnings,
    variable,
)

_SERVE_OPTIONS = ("triton_url", "host", "port", "model_dir", "workers", "models", "default_model")
_IMPORT_NAMES = {"nvidia-pytriton": "pytriton", "scikit-learn": "sklearn", "pyyaml": "yaml", "pillow": "PIL"}
"""Distributions whose import name is not their own name with dashes as underscores."""


def _extra_modules() -> list[tuple[str, str]]:
    """(extra, import name) for every distribution of keyrank's optional extras, from its installed metadata."""
    try:
        requirements = metadata.requires("keyrank") or []
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return []
    pairs = []
    for line in requirements:
        found = re.match(r"\s*([A-Za-z0-9._-]+).*;.*\bextra\s*==\s*['\"]([^'\"]+)['\"]", line)
        if found:
            name = found.group(1).lower()
            pairs.append((found.group(2), _IMPORT_NAMES.get(name, name.replace("-", "_").replace(".", "_"))))
    return pairs


def extra_providing(module: str) -> str | None:
    """The optional extra whose distributions provide ``module`` (``a.b`` counts as ``a``), if any."""
    top = module.split(".")[0]
    return next((extra for extra, name in _extra_modules() if name == top), None)


_NEEDS = {"eval": ("eval",), "tune": ("eval",), "finetune": ("export", "eval")}
"""Extras a subcommand cannot run without: checked before it starts, not where it first imports one, minutes in."""


def _check_extras(command: str) -> None:
    for extra, module in _extra_modules():
        if extra in _NEEDS.get(command, ()) and importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)


_HELP = ("-h", "--help")


def _run_subcommand(command: str, run, rest: Sequence[str] = ()) -> int:
    """Run a subcommand; a module of an optional extra that is not installed, or a setting that does not parse,
    becomes one line and exit 2. ``--help`` needs no extra: the parsers import none (tests/test_cli.py)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        try:
            if not any(flag in rest for flag in _HELP):
                _check_extras(command)
            return run() or 0
        except (ValidationError, SettingsError) as exc:  # Settings() read where a command builds its parser
            bad = bad_setting(exc)
            if bad is None:
                raise
            raise bad from None
    except BadSetting as exc:
        print(f"keyrank {command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        extra = extra_providing(exc.name or "")
        if extra is None:
            raise
        print(f"keyrank {command} needs the {extra} extra (no module named {exc.name!r}): pip install 'keyrank[{extra}]'",
              file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> int:
    from keyrank.modelserver.launcher import serve

    overrides = {k: v for k, v in vars(args).items() if k in _SERVE_OPTIONS}
    # the serving defaults of the folder served (--model-dir may name another than the environment's), over what
    # the user set alone: get_settings() already holds the environment folder's
    given = environment_settings()
    settings, taken = serving_defaults(given.with_overrides(**overrides), given.model_fields_set)
    if taken:
        print(f"keyrank serve: {settings.gateway_dir / SERVING_FILE} sets "
              + ", ".join(f"{variable(k)}={v}" for k, v in taken.items())
              + " (what this model was measured best with; a KEYRANK_* variable overrides it)", flush=True)
    for warning in serving_warnings(settings):  # finetune measured the model it started from reading better
        print(f"keyrank serve: warning: {warning}", file=sys.stderr, flush=True)
    settings.check_files()  # before Triton starts, not as a traceback once the gateway loads them
    return serve(settings)


def _serve_parser(commands: argparse._SubParsersAction, settings: Settings) -> None:
    """Defaults shown are the effective ones: the KEYRANK_* environment over the built-in defaults."""
    serve = commands.add_parser(
        "serve",
        help="run the gateway (and an embedded CPU Triton unless --triton-url)",
        description="Run the HTTP gateway. Without --triton-url it starts and supervises an embedded CPU Triton "
        "(the nvidia-pytriton wheel's tritonserver) on free loopback ports. Every option can also be set "
        "as an environment variable KEYRANK_<NAME>; all other settings are listed in service/keyrank/config.py.",
        formatter_class=DefaultsHelpFormatter,
    )
    serve.add_argument(
        "--triton-url", default=argparse.SUPPRESS if settings.triton_url is None else settings.triton_url,
        help="host:port of an external Triton's gRPC endpoint (KEYRANK_TRITON_URL)"
        + (" (default: unset, i.e. start an embedded CPU Triton)" if settings.triton_url is None else ""),
    )
    serve.add_argument("--host", default=settings.host, help="address the gateway binds (KEYRANK_HOST)")
    serve.add_argument("--port", type=int, default=settings.port, help="port of the gateway (KEYRANK_PORT)")
    serve.add_argument(
        "--model-dir", type=Path, default=settings.model_dir,
        help="output of `keyrank prepare` (triton-embedded/, gateway/); relative to the current folder (KEYRANK_MODEL_DIR)",
    )
    serve.add_argument("--workers", type=int, default=settings.workers, help="uvicorn worker processes (KEYRANK_WORKERS)")
    serve.add_argument(
        "--models", default=argparse.SUPPRESS if settings.models is None else settings.models, metavar="NAME=FOLDER,...",
        help="several prepared models side by side, e.g. base=models,ft=models-ft: a request's `model` picks one, the "
        "embedded Triton loads them all; replaces --model-dir (KEYRANK_MODELS)"
        + (" (default: unset, i.e. the one model of --model-dir)" if settings.models is None else ""),
    )
    serve.add_argument(
        "--default-model", default=argparse.SUPPRESS if settings.default_model is None else settings.default_model,
        help="the model of requests that name none, one of --models' names (KEYRANK_DEFAULT_MODEL)"
        + (" (default: unset, i.e. the first of --models)" if settings.default_model is None else ""),
    )
    serve.set_defaults(run=_serve)


def _guard(rest: list[str]) -> int:
    from keyrank.modelserver.guard import main as guard_main

    return guard_main(rest)


def _prepare(rest: list[str]) -> int:
    from keyrank.prepare.export import main as prepare_main

    return prepare_main(rest)


def _eval(rest: list[str]) -> int:
    from keyrank.evaluation.cli import main as eval_main

    return eval_main(rest)


def _bench(rest: list[str]) -> int:
    from keyrank.bench import main as bench_main

    return bench_main(rest)


def _finetune(rest: list[str]) -> int:
    from keyrank.training.cli import main as finetune_main

    return finetune_main(rest)


def _tune(rest: list[str]) -> int:
    from keyrank.evaluation.tune import main as tune_main

    return tune_main(rest)


def _idf(rest: list[str]) -> int:
    from keyrank.select.idf import main as idf_main

    return idf_main(rest)


_OWN_FLAGS = {"prepare": _prepare, "eval": _eval, "bench": _bench, "guard": _guard, "finetune": _finetune, "idf": _idf,
              "tune": _tune}
"""Subcommands that parse their own flags (their --help lists them with their defaults)."""


def parser(settings: Settings | None = None) -> argparse.ArgumentParser:
    """``keyrank``'s parser: its subcommands (those that own their flags parse them themselves). ``settings``
    are the defaults ``serve --help`` shows; None = the built-in ones."""
    parser = argparse.ArgumentParser(prog="keyrank", description="Re-ranking service for long documents.")
    parser.add_argument("--version", action="version", version=f"keyrank {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("prepare", help="export a cross-encoder (+ bi-encoder) to ONNX and write the Triton repositories", add_help=False)
    _serve_parser(commands, settings or Settings.model_construct())
    commands.add_parser("finetune", help="fine-tune a reranker (or train a PARADE aggregator) on judged data, on the served inputs", add_help=False)
    commands.add_parser("eval", help="measure strategies on the shared judged data (KEYRANK_EVAL_DATA_DIR), or on your TREC files (--task trec)", add_help=False)
    commands.add_parser("tune", help="choose strategy, selector and keyb2 settings on your judged dev queries; writes an env file serve reads", add_help=False)
    commands.add_parser("bench", help="preprocessing throughput vs the raw tokenizer", add_help=False)
    commands.add_parser("guard", help="model-path liveness for a Triton pod (Kubernetes sidecar)", add_help=False)
    commands.add_parser("idf", help="build a BM25 IDF table from your own documents (KEYRANK_BM25_IDF_TABLE)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # prepare / eval / bench / guard / finetune / tune / idf own their flags: hand them the rest of the line.
    if argv and argv[0] in _OWN_FLAGS:
        command, rest = argv[0], argv[1:]
        return _run_subcommand(command, lambda: _OWN_FLAGS[command](rest), rest)
    try:
        settings = get_settings()
    except BadSetting as exc:
        if argv and argv[0] == "serve":  # its --help shows the effective settings: there are none to show
            print(f"keyrank serve: {exc}", file=sys.stderr)
            return 2
        settings = None  # `keyrank --help` and `--version` still answer, with the built-in defaults
    args = parser(settings).parse_args(argv)
    return _run_subcommand(args.command, lambda: args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
