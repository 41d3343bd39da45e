"""A keyrank process killed outright (SIGKILL, the OOM killer) cannot remove its embedded Triton's work
dir and shared-memory regions; the next EmbeddedTriton on the machine does, and never a live one's.
Real processes, real flock, real /dev/shm files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

from keyrank.modelserver import leftovers

OWNER = textwrap.dedent("""
    import sys, tempfile, time
    from pathlib import Path
    from keyrank.modelserver import leftovers
    work_dir = Path(tempfile.mkdtemp(prefix=leftovers.WORK_DIR_PREFIX, dir=sys.argv[1]))
    prefix = sys.argv[2]
    fd = leftovers.claim(work_dir, prefix)
    (Path("/dev/shm") / (prefix + "region")).write_bytes(b"x" * 4096)  # as the Python backend's regions
    print(work_dir, flush=True)
    time.sleep(600)
""")


def _owner(parent: Path) -> tuple[subprocess.Popen, Path, Path]:
    prefix = f"keyrank_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(parent), prefix], stdout=subprocess.PIPE, text=True)
    work_dir = Path(proc.stdout.readline().strip())
    return proc, work_dir, Path("/dev/shm") / (prefix + "region")


def test_a_killed_owners_work_dir_and_regions_are_swept_and_a_live_owners_are_not(tmp_path):
    killed, killed_dir, killed_region = _owner(tmp_path)
    live, live_dir, live_region = _owner(tmp_path)
    made_before_locks = tmp_path / (leftovers.WORK_DIR_PREFIX + "old")  # no lock file: not judged
    made_before_locks.mkdir()
    try:
        assert killed_region.exists() and live_region.exists()
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
        removed = leftovers.sweep(tmp_path)
        assert set(removed) == {killed_dir, killed_region}
        assert not killed_dir.exists() and not killed_region.exists()
        assert live_dir.exists() and live_region.exists() and made_before_locks.exists()
        assert leftovers.sweep(tmp_path) == []  # nothing more: the live owner still holds its lock
    finally:
        live.kill()
        live.wait(10)
        live_region.unlink(missing_ok=True)
        killed_region.unlink(missing_ok=True)
    assert leftovers.sweep(tmp_path) == [live_dir]


def test_an_embedded_triton_sweeps_what_a_killed_one_left_and_removes_its_own_at_close(prepared_models):
    from keyrank.config import Settings
    from keyrank.modelserver.embedded import EmbeddedTriton

    killed, killed_dir, killed_region = _owner(Path(tempfile.gettempdir()))
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(10)
    triton = EmbeddedTriton(settings=Settings(model_dir=prepared_models), supervise=False)  # not started: __init__ sweeps
    try:
        assert not killed_dir.exists() and not killed_region.exists()
        assert (triton.work_dir / leftovers.LOCK).exists()
        assert leftovers.sweep(Path(tempfile.gettempdir())) == []  # its own dir is held
    finally:
        triton.close()
        killed_region.unlink(missing_ok=True)
    assert not triton.work_dir.exists()
