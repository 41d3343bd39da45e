"""The fixed splits of the judged data: which topics and meetings are reported, which may train.

Pure functions of an id (crc32 of a salted key): the same on every machine and
seed, and a split does not move when data is added. Evaluation reads them to
report on held-back data; training (``training/splits.py``) reads them to keep
off it. Both import this module; it imports neither.
"""

from __future__ import annotations

import zlib

DL20_SALT = "keyrank/dl20-split/"
"""Salt of the DL20 topic split: changing it re-splits the topics (and invalidates reported numbers)."""
QMSUM_DEV_SALT = "keyrank/qmsum-dev/"
"""Salt of the QMSum train -> (train, dev) meeting split."""
SQUAD_SALT = "keyrank/squad-split/"
"""Salt of the SQuAD article split (far-relevant training reads one half)."""
DEV_PERCENT = 10
"""Share of QMSum train meetings kept for the dev metric."""


def _bucket(salt: str, key: str, modulo: int) -> int:
    return zlib.crc32((salt + key).encode("utf-8")) % modulo


def dl20_held_back(qid: str) -> bool:
    """True for the DL20 topics that are reported and never trained on."""
    return _bucket(DL20_SALT, str(qid), 2) == 1


def squad_held_back(article: str) -> bool:
    """True for the SQuAD articles (by title) that far-relevant training never reads."""
    return _bucket(SQUAD_SALT, article, 2) == 1


def qmsum_dev_meeting(meeting: str) -> bool:
    """True for QMSum train meetings kept for the dev metric."""
    return _bucket(QMSUM_DEV_SALT, meeting, 100) < DEV_PERCENT
