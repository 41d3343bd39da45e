"""Where the real model and judged data live (../shared beside the repository)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KEYRANK_SHARED", REPO.parent / "shared"))
CE_MODEL = SHARED / "models" / "ce-minilm-l6"
DATASETS = SHARED / "datasets"
