"""What a keyrank process killed outright leaves behind, and its removal by the next one.

An embedded Triton's private work dir (``<tmp>/keyrank-triton-*``) and its Python backend's
shared-memory regions (``/dev/shm/keyrank_<pid>_<id>_*``) are removed when the process that made them
stops (``close``, atexit, SIGTERM). A process killed with SIGKILL (the OOM killer, ``kill -9``, a
container runtime's last resort) cannot: the next ``EmbeddedTriton`` on the machine removes them.

Ownership is an ``flock`` the owner holds on ``<work dir>/owner.lock`` for its whole life. The kernel
drops it with the process, however it dies, and it holds across PID namespaces (two containers sharing
/tmp cannot take each other's live files for stale ones, as a PID check could). A work dir whose lock
nobody holds is stale, and so are the regions named in its ``shm-prefix`` file. A work dir without a
lock file (being made, or not keyrank's) is left alone.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

WORK_DIR_PREFIX = "keyrank-triton-"
"""``tempfile.mkdtemp`` prefix of every embedded Triton's private work dir."""
LOCK = "owner.lock"
PREFIX_FILE = "shm-prefix"
SHM = Path("/dev/shm")


def claim(work_dir: Path, shm_prefix: str) -> int:
    """Hold ``work_dir``'s owner lock for this process's life (the returned fd; closing it lets go).
    The lock file appears under its name only once held, so a sweeper never finds it free."""
    (work_dir / PREFIX_FILE).write_text(shm_prefix)
    tmp = work_dir / (LOCK + ".tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.replace(tmp, work_dir / LOCK)
    return fd


def sweep(parent: Path, shm: Path = SHM) -> list[Path]:
    """Remove the work dirs under ``parent`` whose owner is gone, and their shared-memory regions;
    returns what was removed."""
    removed: list[Path] = []
    for work_dir in parent.glob(WORK_DIR_PREFIX + "*"):
        try:
            fd = os.open(work_dir / LOCK, os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # no lock file (being made, made before locks, not ours) or not readable: not ours to judge
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its owner lives
                continue
            try:
                prefix = (work_dir / PREFIX_FILE).read_text().strip()
            except OSError:
                prefix = ""
            if prefix.startswith("keyrank_"):
                for region in shm.glob(prefix + "*"):
                    region.unlink(missing_ok=True)
                    removed.append(region)
            shutil.rmtree(work_dir, ignore_errors=True)
            removed.append(work_dir)
        finally:
            os.close(fd)
    if removed:
        log.warning("removed what a killed keyrank process left behind: %s", ", ".join(map(str, removed)))
    return removed
