"""How many CPU cores this process may use: what every thread pool and worker count of keyrank is sized from.

A container's CPU limit does not show in the CPU affinity: a pod with ``limits.cpu: 2`` on a 64-core node, or
``docker run --cpus 2``, sees 64 cores there and may use 2. Threads sized by the affinity then queue for the
quota, and the CFS throttles the whole process for the rest of each period (a spinning ONNX Runtime pool
most of all). Passing an explicit thread count also switches off the libraries' own guess, so keyrank must
make the right one.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
"""cgroup v2's CPU limit of this container ("<quota> <period>" or "max <period>"), where there is one."""

CORES_ENV = "KEYRANK_USABLE_CORES"
"""Set by keyrank for the embedded Triton it starts: its Python model imports nothing from keyrank, so it reads
the count from here (``modelserver/python_models/model.py``); a user may set it for a standalone Triton too."""


def usable_cores() -> float:
    """Cores this process may use: its CPU affinity, capped by the container's CPU limit (``CGROUP_CPU_MAX``,
    read at each call) where one is set; at least 1."""
    cores = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(int(quota) / int(period), 1.0))
    except (OSError, ValueError):
        pass
    return cores


def thread_count() -> int:
    """Threads for a pool that should keep every usable core busy: ``usable_cores`` rounded down (a 2.5-CPU
    limit runs 2 threads, so the pool never waits on the quota), at least 1."""
    return max(1, int(usable_cores()))
