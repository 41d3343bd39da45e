"""docs/CONFIGURATION.md, written from the settings' fields (tests/test_docs.py keeps the page equal to it):
every ``Settings`` field with its variable, type, default and meaning, and the variables read outside them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import SecretStr

from keyrank.config import ENV_FILE_VARIABLE, Selector, Settings, Strategy, variable

OTHER_VARIABLES: dict[str, tuple[str, str]] = {
    ENV_FILE_VARIABLE: ("unset", "A file of `KEYRANK_*=value` lines read under the environment (the environment wins), e.g. "
                        "`tune/keyrank.env` from `keyrank tune`; docker `--env-file` and compose `env_file:` read the same "
                        "file. A file that is not there stops every command, naming it (exit 2)."),
    "KEYRANK_USABLE_CORES": ("the usable cores", "Cores the embedded Triton's model sizes its threads from (divided among "
                             "its instances). keyrank sets it for the Triton it starts: the CPU affinity, capped by a "
                             "container's CPU limit (cgroup v2 `cpu.max`); the gateway's own runtimes and `keyrank bench` "
                             "count the same way. Set it for a Triton you run yourself in a container with a CPU limit."),
    "KEYRANK_EMBEDDED_ORT_THREADS": ("unset", "Threads of the embedded CPU model's runtime (ONNX Runtime or OpenVINO), fixed "
                                     "(over its config's `intra_op_thread_count` and KEYRANK_USABLE_CORES)."),
    "KEYRANK_EMBEDDED_RUN_TOKENS": ("4096 (ONNX Runtime), 512 (OpenVINO)", "Most tokens (rows x width) one run of the "
                                    "embedded CPU model takes: bigger merged batches run in slices, bounding the model "
                                    "process's peak memory (docs/RELIABILITY.md); 0 = one run per batch."),
}
"""Variables read outside ``Settings``, by the embedded model process (which imports nothing from keyrank) or
before the settings are read: variable -> (default, meaning)."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _bounds(metadata: list) -> str:
    limits = []
    for item in metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                limits.append(f"{sign} {getattr(item, attr)}")
    return f", {' and '.join(limits)}" if limits else ""


def _type_of(annotation: object) -> str:
    args, origin = get_args(annotation), get_origin(annotation)
    if annotation in (Strategy, Selector):
        return f"a {'strategy' if annotation is Strategy else 'selector'} of the registry (README)"
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if type(None) in args:
        return _type_of(next(a for a in args if a is not type(None))) + " or unset"
    if origin is list:
        return f"JSON list of {_type_of(args[0])}"
    names = {Path: "path", SecretStr: "secret text", bool: "`true` / `false`", int: "integer", float: "number", str: "text"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))  # type: ignore[call-overload]


def _default_of(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and value >= 2**20 and value % 2**20 == 0:
        return f"{value} ({value // 2**20} MiB)"
    if isinstance(value, list):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def markdown_table() -> str:
    """docs/CONFIGURATION.md's table: every ``Settings`` field in declaration order with its variable, type,
    default and meaning (its description)."""
    rows = ["| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        kind = _type_of(field.annotation) + _bounds(field.metadata)
        rows.append(f"| `{variable(name)}` | {_cell(kind)} | {_cell(_default_of(field.default))} | {_cell(field.description or '')} |")
    return "\n".join(rows) + "\n"


def other_variables_table() -> str:
    """docs/CONFIGURATION.md's table of ``OTHER_VARIABLES``."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{name}` | {_cell(default)} | {_cell(meaning)} |" for name, (default, meaning) in OTHER_VARIABLES.items()]
    return "\n".join(rows) + "\n"
