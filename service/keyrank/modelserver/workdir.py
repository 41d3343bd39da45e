"""The private work dir of one embedded Triton: its backends/, its log, the repository it serves,
and the names of its shared-memory regions, all owned through a lock for the life of the process.

Made after sweeping what killed processes left behind, and removed with its regions when the
server is closed; a process killed outright leaves them to the next one (``leftovers``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from keyrank.modelserver import leftovers


class WorkDir:
    """A directory under the temp dir made for one server (or the caller's), held by the owner lock."""

    def __init__(self, path: Path | None = None) -> None:
        leftovers.sweep(Path(tempfile.gettempdir()))
        self.own: bool = path is None
        """Made here, so removed at the end; a caller's dir is the caller's to remove."""
        self.path: Path = Path(path or tempfile.mkdtemp(prefix=leftovers.WORK_DIR_PREFIX))
        """backends/, the server log and the served repository."""
        self.shm_prefix: str = f"keyrank_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        """Prefix of the Python backend's shared-memory regions in /dev/shm, so a killed server's can be found."""
        # A caller's dir is never swept, so the lock that says we live gets a dir of its own.
        self._owner_dir = self.path if self.own else Path(tempfile.mkdtemp(prefix=leftovers.WORK_DIR_PREFIX))
        self._owner_fd: int | None = leftovers.claim(self._owner_dir, self.shm_prefix)

    def remove_shared_memory(self) -> None:
        """Unlink the regions a stopped server left in /dev/shm (its stubs cannot when they are killed)."""
        for region in leftovers.SHM.glob(self.shm_prefix + "*"):
            region.unlink(missing_ok=True)

    def remove(self) -> None:
        """Remove the dir if ours (else the lock's dir), then let go of the lock; idempotent."""
        shutil.rmtree(self._owner_dir, ignore_errors=True)
        if self._owner_fd is not None:  # only once the dir is gone, so no sweeper finds it half removed
            os.close(self._owner_fd)
            self._owner_fd = None
