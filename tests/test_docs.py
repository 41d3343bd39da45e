"""The docs are written from the code or checked against it, so they cannot drift:

- docs/CONFIGURATION.md is ``keyrank.config_docs.markdown_table()`` (every ``Settings`` field) and names no
  variable that does not exist;
- docs/GUIDE.md's command table has one row per subcommand;
- docs/GUIDE.md's Python example and the README's requests are run, and what they print or answer is what
  the pages show.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prepared_variants import as_variant
from shared_data import REPO, SHARED

from keyrank.config import Settings, variable
from keyrank.config_docs import OTHER_VARIABLES, markdown_table, other_variables_table

CONFIGURATION = REPO / "docs" / "CONFIGURATION.md"
GUIDE = REPO / "docs" / "GUIDE.md"
README = REPO / "README.md"
VARIABLE = re.compile(r"KEYRANK_[A-Z0-9_]*[A-Z0-9]")

TEST_HOOKS = {"KEYRANK_EMBEDDED_FAULT_FILE"}
"""Variables the service reads only for the fault tests (tests/test_faults.py), not for users."""


# --- CONFIGURATION.md -------------------------------------------------------------------------------------


def test_configuration_documents_every_setting_as_the_code_describes_it():
    text = CONFIGURATION.read_text()
    assert markdown_table() in text, "docs/CONFIGURATION.md is not keyrank.config_docs.markdown_table(): paste it in again"
    assert other_variables_table() in text
    for name, field in Settings.model_fields.items():
        assert field.description, f"Settings.{name} has no description: it is its line in docs/CONFIGURATION.md"


def test_configuration_names_no_variable_that_does_not_exist():
    known = {variable(name) for name in Settings.model_fields} | set(OTHER_VARIABLES)
    assert sorted(set(VARIABLE.findall(CONFIGURATION.read_text())) - known) == []


def test_every_variable_the_service_reads_is_documented():
    read = {name for path in (REPO / "service" / "keyrank").rglob("*.py") for name in VARIABLE.findall(path.read_text())}
    documented = {variable(name) for name in Settings.model_fields} | set(OTHER_VARIABLES) | TEST_HOOKS
    assert sorted(read - documented) == []


# --- GUIDE.md's command table ------------------------------------------------------------------------------


def test_the_guides_command_table_has_one_row_per_subcommand():
    from keyrank.cli import parser

    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    section = GUIDE.read_text().split("## Command line", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `keyrank (\w+)` \|", section, re.M)
    assert rows == list(dict.fromkeys(rows)) and sorted(rows) == sorted(commands)


# --- GUIDE.md's Python example, run ------------------------------------------------------------------------


def _python_blocks() -> tuple[str, list[str]]:
    """The GUIDE's first two Python blocks as one script, and what its print lines say they print."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)[:2]
    script = "\n".join(blocks)
    return script, re.findall(r"^\s*print\(.*\)\s+# (.+)$", script, re.M)


def _run_guide(model_dir: Path, cwd: Path) -> list[str]:
    script, _ = _python_blocks()
    located = 'models = Path(keyrank.__file__).resolve().parents[2] / "models"'
    assert located in script, "the GUIDE's example no longer finds the models where the test points it"
    script = script.replace(located, f"models = Path({str(model_dir)!r})")
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "PYTHONPATH": str(REPO / "service")})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


@pytest.mark.triton
@pytest.mark.timeout(600)
def test_the_guides_python_example_prints_what_the_guide_says(prepared_models, tmp_path):
    """On the fp32 function (the tests' fused variant) the lines the GUIDE gives for fp32; on OpenVINO bf16
    (what `keyrank prepare` serves on a CPU with bfloat16) the lines in the code's comments."""
    from keyrank.scoring import openvino

    _, commented = _python_blocks()
    assert len(commented) == 2
    fp32 = re.search(r"the same lines print `([^`]+)`", GUIDE.read_text())
    assert fp32, "the GUIDE no longer says what the fp32 variants print"
    assert _run_guide(prepared_models, tmp_path) == [fp32.group(1), commented[1]]
    if not openvino.bf16_supported():
        pytest.skip("this CPU has no bfloat16: the GUIDE's bf16 lines cannot be reproduced here (fp32's were)")
    bf16 = as_variant(prepared_models, tmp_path / "bf16", "openvino-bf16", {"runtime": "openvino", "precision": "bf16"})
    assert _run_guide(bf16, tmp_path) == commented


# --- the README's requests, sent ---------------------------------------------------------------------------


def _same(shown, answered, where: str = "answer") -> None:
    """``answered`` has ``shown``'s shape: the same keys and lists, equal values, scores within 0.05 (the README
    shows them rounded, as bf16 serves them), timings' keys only (their values are one run's)."""
    if isinstance(shown, dict):
        assert isinstance(answered, dict) and list(answered) == list(shown), (where, list(answered), list(shown))
        for key in shown:
            if key != "timings_ms":
                _same(shown[key], answered[key], f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(answered, list) and len(answered) == len(shown), (where, answered, shown)
        for i, (s, a) in enumerate(zip(shown, answered)):
            _same(s, a, f"{where}[{i}]")
    elif isinstance(shown, float):
        assert isinstance(answered, float) and math.isclose(answered, shown, abs_tol=0.05), (where, answered, shown)
    else:
        assert answered == shown, (where, answered, shown)


def _readme_example() -> tuple[dict, dict]:
    section = README.read_text().split("## Ask it something", 1)[1]
    body = re.search(r"-d '(\{.*?\})'\n```", section, re.S)
    shown = re.search(r"```json\n(.*?)```", section, re.S)
    assert body and shown, "the README's curl and its answer are not where the test reads them"
    return json.loads(body.group(1)), json.loads(shown.group(1))


def test_the_readmes_curl_uses_the_default_strategy():
    body, shown = _readme_example()
    default = Settings.model_fields["default_strategy"].default
    assert "strategy" not in body and shown["strategy"] == default


@pytest.mark.triton
def test_the_readmes_curl_answers_what_the_readme_shows(prepared_models, embedded_triton):
    from fastapi.testclient import TestClient

    from keyrank.api import create_app

    body, shown = _readme_example()
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url)
    with TestClient(create_app(settings)) as client:
        answer = client.post("/rerank", json=body)
    assert answer.status_code == 200, answer.text
    _same(shown, answer.json())


@pytest.mark.triton
def test_the_readmes_long_document_reads_what_the_readme_says(prepared_models, embedded_triton):
    from fastapi.testclient import TestClient

    from keyrank.api import create_app

    path = SHARED / "datasets" / "qmsum" / "val" / "ES2006a.json"
    if not path.is_file():
        pytest.skip(f"QMSum not found at {path}")
    text = README.read_text().split("## Ask it something", 1)[1].split("\n## ", 1)[0]
    said = re.search(r"a ([\d,]+)-character\s+meeting \(QMSum ES2006a\) asked \"([^\"]+)\", the default answers\s+"
                     r"`\"truncated\": true, \"read_tokens\": (\d+), \"document_tokens\": (\d+)` from (\d+) short inputs, "
                     r"where `maxp` scores\s+(\d+) overlapping windows", text)
    assert said, "the README's long-document sentence changed: update this test with it"
    chars, query, read, tokens, inputs, windows = said.groups()
    meeting = "\n".join(f"{t['speaker']}: {t['content']}" for t in json.loads(path.read_text())["meeting_transcripts"])
    assert len(meeting) == int(chars.replace(",", ""))
    settings = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url)
    with TestClient(create_app(settings)) as client:
        default = client.post("/rerank", json={"query": query, "documents": [meeting]}).json()
        maxp = client.post("/rerank", json={"query": query, "documents": [meeting], "strategy": "maxp"}).json()
    result = default["results"][0]
    assert (result["truncated"], result["read_tokens"], result["document_tokens"]) == (True, int(read), int(tokens))
    assert default["usage"]["scored_sequences"] == int(inputs) and maxp["usage"]["scored_sequences"] == int(windows)
