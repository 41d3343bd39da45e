"""Where the real model and judged data live (../shared beside the repository), and private copies of
the prepared models folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KEYRANK_SHARED", REPO.parent / "shared"))
CE_MODEL = SHARED / "models" / "ce-minilm-l6"
DATASETS = SHARED / "datasets"


def linked_copy(src: Path, dst: Path) -> Path:
    """A private copy of a prepared tree that costs no disk: big files are hard links (prepare
    replaces files by rename, so it never writes through a link into the original)."""
    from keyrank.prepare.export import LOCK_NAME

    shutil.copytree(src, dst, copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__", LOCK_NAME))
    return dst
