"""The command line explains itself: every option of every subcommand has a help line with its default,
a missing optional extra is one line naming it (exit 2), and finetune refuses data it cannot train on.

The help walk runs ``keyrank <command> --help`` in-process; the missing extra and finetune run the real
``keyrank`` entry point in a subprocess (the extra's module blocked with ``sys.modules[name] = None``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from shared_data import CE_MODEL, REPO

from keyrank.cli import extra_providing, main

_ENTRY = re.compile(r"^  -")  # an option's first line in argparse's help
_EXEMPT = ("-h, --help",)  # argparse's own, no value, no default


def _help_of(argv: list[str]) -> str:
    """What ``keyrank <argv>`` prints, one option per line where it fits (no wrapping mid-entry)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.MonkeyPatch.context() as env:
        env.setenv("COLUMNS", "400")
        with pytest.raises(SystemExit) as exit_:
            main(argv)
    assert exit_.value.code == 0, f"keyrank {' '.join(argv)} exited {exit_.value.code}"
    return out.getvalue()


def _subcommands() -> list[str]:
    """The subcommands ``keyrank --help`` lists (whatever is registered: a new one is walked too)."""
    found = re.search(r"\{([\w,-]+)\}", _help_of(["--help"]))
    assert found, "keyrank --help lists no subcommands"
    return found.group(1).split(",")


def options_without_help_or_default(help_text: str) -> list[str]:
    """Options whose help line is missing, or ends without ``(default: ...)`` (required ones say ``(required)``)."""
    entries: list[list[str]] = []
    current: list[str] | None = None
    for line in help_text.splitlines():
        if _ENTRY.match(line):
            current = [line]
            entries.append(current)
        elif current is not None and line.startswith("   ") and line.strip():
            current.append(line)  # the help, on the next lines when the invocation is long
        else:
            current = None
    bad = []
    for entry in entries:
        invocation, *help_parts = re.split(r"\s{2,}", entry[0].strip(), maxsplit=1)
        help_ = " ".join(help_parts + [line.strip() for line in entry[1:]])
        if invocation in _EXEMPT:
            continue
        if not help_:
            bad.append(f"{invocation}: no help line")
        elif "(default: " not in help_ and not help_.endswith("(required)"):
            bad.append(f"{invocation}: no default in {help_!r}")
    return bad


def test_the_help_checker_finds_an_option_without_help_or_default():
    """The walk below can fail: a bare option and one without its default are caught, a good one is not."""
    text = (
        "options:\n  -h, --help            show this help message and exit\n"
        "  --bare BARE\n"
        "  --no-default N        something useful\n"
        "  --good GOOD           something (default: 3)\n"
        "  --long-option-name LONG_OPTION_NAME\n                        wrapped help (default:\n                        7)\n"
        "  --model MODEL         a checkpoint (required)\n"
    )
    assert options_without_help_or_default(text) == [
        "--bare BARE: no help line", "--no-default N: no default in 'something useful'",
    ]


@pytest.mark.parametrize("command", _subcommands())
def test_every_option_of_every_subcommand_has_a_help_line_with_its_default(command):
    text = _help_of([command, "--help"])
    assert re.search(r"^\s+--\w", text, re.M), f"keyrank {command} --help lists no options:\n{text}"
    assert options_without_help_or_default(text) == [], text


def test_serve_shows_the_effective_default_from_the_environment(monkeypatch):
    from keyrank.config import get_settings

    monkeypatch.setenv("KEYRANK_PORT", "9123")
    get_settings.cache_clear()
    try:
        assert "(default: 9123)" in _help_of(["serve", "--help"])
    finally:
        monkeypatch.delenv("KEYRANK_PORT")
        get_settings.cache_clear()


def test_none_in_the_environment_unsets_a_number_that_may_be_unset(monkeypatch):
    from keyrank.config import Settings

    monkeypatch.delenv("KEYRANK_KEYB2_BLOCKS_LEAD", raising=False)
    assert Settings().keyb2_blocks_lead == Settings.model_fields["keyb2_blocks_lead"].default is not None
    monkeypatch.setenv("KEYRANK_KEYB2_BLOCKS_LEAD", "none")
    assert Settings().keyb2_blocks_lead is None
    monkeypatch.setenv("KEYRANK_KEYB2_BLOCKS_LEAD", "2")
    assert Settings().keyb2_blocks_lead == 2
    monkeypatch.setenv("KEYRANK_API_KEY", "none")  # a text setting keeps the word: "none" is a key, not "no key"
    assert Settings().api_key.get_secret_value() == "none"


@pytest.mark.parametrize(("command", "option"), [("eval", "--data-dir"), ("finetune", "--data-dir"), ("bench", "--datasets")])
def test_the_judged_data_is_where_KEYRANK_EVAL_DATA_DIR_says(monkeypatch, tmp_path, command, option):
    from keyrank.config import Settings, get_settings

    monkeypatch.setenv("KEYRANK_EVAL_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    try:
        entry = next(line for line in _help_of([command, "--help"]).splitlines() if line.lstrip().startswith(option))
        assert entry.endswith(f"(default: {tmp_path})"), entry
        # Where the data sits changes no score: a dump of the settings (the key of training caches and eval
        # checkpoints) leaves it out, and a copy with overrides keeps it.
        assert "eval_data_dir" not in Settings().model_dump()
        assert Settings().with_overrides(port=9123).eval_data_dir == tmp_path
    finally:
        monkeypatch.delenv("KEYRANK_EVAL_DATA_DIR")
        get_settings.cache_clear()


# --- a missing optional extra: one line, exit 2 ----------------------------------------------------------


def _keyrank_without(blocked: list[str], argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``keyrank <argv>`` in a fresh interpreter where importing any of ``blocked`` fails as if not installed."""
    code = (f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
            f"from keyrank.cli import main\nsys.exit(main({argv!r}))\n")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO / "service")})


def test_extras_are_read_from_the_installed_metadata():
    assert (extra_providing("ir_measures"), extra_providing("matplotlib.pyplot"), extra_providing("torch")) == ("eval", "eval", "export")
    assert extra_providing("pytriton") == "embedded"
    assert extra_providing("numpy") is None  # a core dependency is no extra's


@pytest.mark.parametrize(("command", "blocked", "extra"), [
    ("eval", "ir_measures", "eval"),
    ("eval", "matplotlib", "eval"),
    ("finetune", "transformers", "export"),
    ("finetune", "torch", "export"),
])
def test_a_missing_extra_is_named_in_one_line_and_exits_2(tmp_path, command, blocked, extra):
    # Real arguments: the check must come before the command's work, not where it first imports the module.
    argv = {"eval": ["eval", "--task", "qmsum", "--max-queries", "1", "--out", str(tmp_path / "eval")],
            "finetune": ["finetune", "--model", str(CE_MODEL), "--out", str(tmp_path / "ft"), "--task", "qmsum"]}[command]
    done = _keyrank_without([blocked], argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"keyrank {command} needs the {extra} extra (no module named {blocked!r}): "
                           f"pip install 'keyrank[{extra}]'\n")
    assert "Traceback" not in done.stderr and not (tmp_path / "eval").exists() and not (tmp_path / "ft").exists()


def test_a_missing_module_of_no_extra_is_not_dressed_up_as_one(tmp_path):
    """Only an extra's module gets the one-line message; anything else is a bug and keeps its traceback."""
    done = _keyrank_without(["keyrank.evaluation.tasks"], ["eval", "--help"], cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" in done.stderr and "ModuleNotFoundError" in done.stderr


# --- the real `keyrank` entry point: --version, --help without extras, a bad setting in one line -----------

_EXTRAS_MODULES = ["ir_measures", "matplotlib", "tqdm", "torch", "transformers", "onnx", "safetensors", "nncf", "wordfreq"]
"""What the eval, export and idf extras install: a command's --help must import none of it."""


def _keyrank(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """The installed ``keyrank`` script, as a user runs it, with ``env`` over this environment."""
    script = Path(sys.executable).with_name("keyrank")
    assert script.is_file(), f"no keyrank script beside {sys.executable}: install the package (make install-dev)"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KEYRANK_")}
    return subprocess.run([str(script), *argv], cwd=cwd, capture_output=True, text=True, timeout=120, env={**clean, **env})


def test_version_prints_the_package_version(tmp_path):
    from keyrank import __version__

    done = _keyrank(["--version"], tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"keyrank {__version__}\n", "")


@pytest.mark.parametrize(("command", "option"), [("eval", "--task"), ("tune", "--qrels"), ("finetune", "--loss")])
def test_help_lists_the_options_of_a_command_whose_extra_is_not_installed(tmp_path, command, option):
    """The parsers import no extra: what a command takes can be read before installing what it runs on."""
    done = _keyrank_without(_EXTRAS_MODULES, [command, "--help"], cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert f"usage: keyrank {command}" in done.stdout and f"  {option}" in done.stdout


@pytest.mark.parametrize(("env", "named"), [
    ({"KEYRANK_PORT": "abc"}, "KEYRANK_PORT=abc: Input should be a valid integer"),
    ({"KEYRANK_KEYB2_BLOCKS": "0"}, "KEYRANK_KEYB2_BLOCKS=0: Input should be greater than or equal to 1"),
    ({"KEYRANK_DEFAULT_STRATEGY": "bestp"}, "KEYRANK_DEFAULT_STRATEGY=bestp: Input should be 'firstp'"),
    ({"KEYRANK_LENGTH_BUCKETS": "64 128"}, "KEYRANK_LENGTH_BUCKETS: not a JSON value of type list[int]"),
    ({"KEYRANK_ENV_FILE": "missing.env"}, "KEYRANK_ENV_FILE=missing.env: no such file"),
    ({"KEYRANK_BM25_IDF": "table"}, "bm25_idf=table needs bm25_idf_table (KEYRANK_BM25_IDF_TABLE)"),
])
def test_a_bad_setting_is_one_line_naming_it_and_exit_2_and_help_still_answers(tmp_path, env, named):
    commands = [["serve"], ["serve", "--help"], ["bench", "--help"], ["idf", "--docs", "d.jsonl", "--out", "idf.json"]]
    if "KEYRANK_ENV_FILE" not in env:  # eval's parser reads the environment's settings (not the file) for a default
        commands.append(["eval", "--help"])
    for argv in commands:
        done = _keyrank(argv, tmp_path, **env)
        assert done.returncode == 2, (argv, done.stdout[-500:], done.stderr[-2000:])
        assert done.stderr.startswith(f"keyrank {argv[0]}: ") and named in done.stderr, (argv, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, (argv, done.stderr)
    top = _keyrank(["--help"], tmp_path, **env)
    assert top.returncode == 0 and "{prepare,serve," in top.stdout and top.stderr == "", top.stderr


@pytest.mark.parametrize(("content", "said"), [
    (None, "no such file"), ('{"mill": 2.1', "not a JSON file"), ("[1, 2]", "a JSON {term: idf} object expected"),
])
def test_an_unreadable_idf_table_stops_serve_in_one_line_before_triton_starts(tmp_path, content, said):
    table = tmp_path / "idf.json"
    if content is not None:
        table.write_text(content)
    done = _keyrank(["serve"], tmp_path, KEYRANK_BM25_IDF_TABLE=str(table))
    assert done.returncode == 2 and done.stderr.startswith(f"keyrank serve: KEYRANK_BM25_IDF_TABLE={table}: {said}"), done.stderr
    assert done.stderr.count("\n") == 1 and "Triton" not in done.stderr


def test_a_bad_serve_option_is_one_line_naming_it(tmp_path):
    done = _keyrank(["serve", "--models", "base=models", "--default-model", "ft"], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "KEYRANK_DEFAULT_MODEL" in done.stderr, done.stderr


# --- finetune: nothing to train on is refused; an empty dev set is said -----------------------------------


@pytest.fixture(scope="module")
def finetune_dir(tmp_path_factory) -> Path:
    """Judged TREC files for two queries (both land in train, none in dev); one run folder for both tests below,
    so the base model is exported once (the second run only checks its fingerprints)."""
    if not CE_MODEL.is_dir():
        pytest.skip(f"real cross-encoder not found at {CE_MODEL}")
    root = tmp_path_factory.mktemp("finetune")
    docs = {
        "d1": "The remote control must not cost more than twelve euros fifty to produce.",
        "d2": "The case will be plastic and the battery a pair of AA cells.",
        "d3": "Whisk the eggs with the sugar, fold in the flour and bake for twenty minutes.",
        "d4": "The train to the coast leaves every hour from platform four.",
    }
    (root / "docs.jsonl").write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in docs.items()))
    (root / "queries.tsv").write_text("q1\twhat may the remote control cost\nq2\twhat is the case made of\n")
    # Every judged candidate relevant: a query with nothing to rank it against.
    (root / "all-relevant.qrels").write_text("q1 0 d1 1\nq1 0 d2 1\nq2 0 d2 1\n")
    (root / "judged.qrels").write_text("q1 0 d1 2\nq1 0 d3 0\nq1 0 d4 0\nq2 0 d2 2\nq2 0 d3 0\nq2 0 d4 0\n")
    return root


def _finetune(root: Path, qrels: str, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "keyrank.cli", "finetune", "--model", str(CE_MODEL), "--out", str(root / "run"),
            "--strategy", "firstp", "--qrels", str(root / qrels), "--docs", str(root / "docs.jsonl"),
            "--queries", str(root / "queries.tsv"), "--no-progress", "--threads", "1", *extra]
    return subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "PYTHONPATH": str(REPO / "service")})


@pytest.mark.timeout(600)
def test_finetune_refuses_data_with_nothing_to_train_on(finetune_dir):
    done = _finetune(finetune_dir, "all-relevant.qrels")
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("keyrank finetune: nothing to train on: none of the 2 training queries has both a relevant "
                           "and a non-relevant candidate; give each query judged non-relevant documents"), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not (finetune_dir / "run" / "model").exists() and not (finetune_dir / "run" / "training.json").exists()


@pytest.mark.timeout(600)
def test_finetune_says_when_the_dev_set_is_empty(finetune_dir):
    # q1 and q2 both fall outside the TREC dev carve-out: trainable, but nothing held out. One step is enough.
    done = _finetune(finetune_dir, "judged.qrels", "--stop-after-steps", "1", "--groups-per-step", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[finetune] warning: the dev set is empty" in done.stderr, done.stderr[-2000:]
    assert "2 training queries (2 trainable), 0 dev queries" in done.stderr
