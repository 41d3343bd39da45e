"""The tritonserver child process: it never outlives us, and a stop reaches everything it started.

It gets its own process group (the Python backend stubs are its children, so one ``killpg``
reaches them all) and ``PR_SET_PDEATHSIG``, so the kernel kills it if we die.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# Resolved in the parent: between fork and exec the child may only make a plain call, since
# another thread (gRPC's, uvicorn's) may hold the loader's lock at the moment of the fork.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the spawning thread dies."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


die_with_parent = _die_with_parent if _prctl is not None else None
"""``preexec_fn`` for the server (None where the kernel has no parent-death signal)."""


class ServerProcess:
    """One spawned tritonserver, reaped by the thread that spawned it."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path, log_path: Path, nice: int = 0) -> None:
        """Spawn ``command`` with stdout and stderr appended to ``log_path``, ``nice`` added to its niceness (its
        children, the model processes it starts while loading, inherit it); raises what the spawn raised."""
        spawned: list[subprocess.Popen | BaseException] = []
        done = threading.Event()

        # PR_SET_PDEATHSIG fires when the spawning *thread* exits, not the process; a dedicated
        # thread that spawns and then waits on the child lives exactly as long as the child (or
        # until this process dies, which is when the child must die).
        def spawn_and_reap() -> None:
            try:
                with open(log_path, "ab") as log:
                    proc = subprocess.Popen(
                        command,
                        env=env,
                        cwd=cwd,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=die_with_parent,
                    )
            except BaseException as exc:  # handed to the caller
                spawned.append(exc)
                done.set()
                return
            if nice:  # set from here, not between fork and exec: Triton starts its model processes much later
                with contextlib.suppress(ProcessLookupError):  # exited already: its log says why
                    os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, proc.pid) + nice)
            spawned.append(proc)
            done.set()
            proc.wait()

        self._reaper = threading.Thread(target=spawn_and_reap, name="keyrank-triton-reaper", daemon=True)
        self._reaper.start()
        done.wait()
        if isinstance(spawned[0], BaseException):
            raise spawned[0]
        self._popen: subprocess.Popen = spawned[0]
        self.reaped: bool = False
        """Stopped or killed here and waited for: its group id must not be signalled again."""

    @property
    def pid(self) -> int:
        """The server's pid, also its process group's id."""
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """Its exit code once it has exited, else None."""
        return self._popen.returncode

    def running(self) -> bool:
        return self._popen.poll() is None

    def stop(self, timeout: float) -> None:
        """SIGTERM the group, SIGKILL what is left after ``timeout``; waits for the server."""
        if self.reaped:
            return
        if self.running():
            self._signal_group(signal.SIGTERM)
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # Stubs may outlive a server that exited on its own; the group still names them.
        self.kill()

    def kill(self) -> None:
        """SIGKILL the whole group at once; waits for the server."""
        if self.reaped:
            return
        self._signal_group(signal.SIGKILL)
        self._popen.wait()
        self._reaper.join()
        self.reaped = True

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self._popen.pid, sig)
        except ProcessLookupError:
            pass
