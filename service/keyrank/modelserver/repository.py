"""The repository the embedded Triton serves, and what it expects of a prepared one.

`keyrank prepare` (``keyrank.prepare.repositories``) writes each model folder by the
names below and copies the Python-backend code of ``python_models/`` beside the
weights; the server reads them as they are. Several prepared folders are served
as one repository that the server stages in its private work dir at start.
"""

from __future__ import annotations

import re
from pathlib import Path

MODEL_NAME = "cross_encoder"
"""Name of the cross-encoder in every repository `keyrank prepare` writes."""
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
"""Input names, INT64 [N, L]; every exported model takes all three."""
PYTHON_MODELS = Path(__file__).resolve().parent / "python_models"
"""The Python-backend models `keyrank prepare` copies into a version folder (they run in Triton's stub)."""


def write_served_repository(out: Path, models: dict[str, Path], variant: str) -> None:
    """One Triton repository serving several prepared models (``keyrank serve --models``): under ``out``, each
    model's ``<folder>/<variant>/cross_encoder`` as ``out/<name>``: its config.pbtxt with the name rewritten,
    its version folder's files as symlinks (no copy of the weights). Raises FileNotFoundError naming a
    folder that was not prepared."""
    for name, folder in models.items():
        source = Path(folder).resolve() / variant / MODEL_NAME
        config = source / "config.pbtxt"
        if not config.is_file():
            raise FileNotFoundError(f"model {name!r}: {config} not found (run `keyrank prepare --out {folder}`)")
        text = re.sub(r'^name: ".*"$', f'name: "{name}"', config.read_text(), count=1, flags=re.MULTILINE)
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "config.pbtxt").write_text(text)
        for version in (p for p in source.iterdir() if p.is_dir() and p.name.isdigit()):
            target = out / name / version.name
            target.mkdir(parents=True, exist_ok=True)
            for file in version.iterdir():
                link = target / file.name
                if not link.is_symlink() or link.resolve() != file.resolve():
                    link.unlink(missing_ok=True)
                    link.symlink_to(file.resolve())
