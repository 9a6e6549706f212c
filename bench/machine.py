"""The line every benchmark prints first: its figures mean little without the machine and the
load they were measured under (2 cores here, often shared with other work)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def describe(*extra: str) -> str:
    """`machine: CPU, cores, OS, Python, load average, OpenMP threads[, extra…]`."""
    parts = [
        cpu_model(),
        f"{os.cpu_count()} CPUs",
        f"{platform.system()} {platform.release()}",
        f"Python {platform.python_version()}",
        f"load {os.getloadavg()[0]:.1f}",
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
        *extra,
    ]
    return "machine: " + ", ".join(parts)
