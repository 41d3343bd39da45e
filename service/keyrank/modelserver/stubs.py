"""The Python backend's model processes (stubs) of a tritonserver, as /proc shows them.

Each model instance of the embedded Triton runs in its own stub, a child of
tritonserver; the supervisor (supervision.py) reads their state here to tell a
killed, stopped or replaced model process from a healthy one.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

STUB_NAME = "triton_python_backend_stub"
"""Executable of the Python backend's model process (``/proc/<pid>/comm`` holds its first 15 bytes)."""


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state, ppid, ...); None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


class Stub(NamedTuple):
    """One Python backend stub as /proc shows it."""

    state: str
    """Process state: R/S/D running or sleeping, T/t stopped, Z/X dead."""
    started: int
    """Start time in clock ticks since boot: a stub started later for the same instance replaced it."""
    instance: tuple[str, ...]
    """The model file and the instance name it runs (from its command line)."""

    @property
    def model(self) -> str:
        """The served model it runs: its model file's folder is ``<repository>/<model>/<version>/``."""
        return Path(self.instance[0]).parent.parent.name if self.instance else ""


def model_stubs(server_pid: int, model: str | None = None) -> dict[int, Stub]:
    """The stubs that ``server_pid`` spawned (of ``model`` only, if given), zombies included."""
    found = {}
    for pid in _children(server_pid):
        fields = _stat(pid)
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if fields is None or int(fields[1]) != server_pid or not STUB_NAME.startswith(comm):
            continue
        # argv: stub, <repository>/<model>/<version>/model.py, shm region, ..., instance name (9th).
        if model is not None and (len(args) < 2 or Path(args[1]).parent.parent.name != model):
            continue
        found[pid] = Stub(fields[0], int(fields[19]), tuple(args[1:2] + args[8:9]))
    return found


def _children(pid: int) -> set[int]:
    """Children of ``pid``: /proc/<pid>/task/*/children where the kernel has it, else a scan of /proc."""
    try:
        return {int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                for child in (task / "children").read_text().split()}
    except (OSError, ValueError):
        pass
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == pid:
                found.add(int(entry.name))
    return found
