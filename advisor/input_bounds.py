"""The most any input file may set: its size, its rows, a node's GPUs, a text field.

Files are read whole before they are checked, and every check after that runs in time linear in
what was read; without these bounds one line of a file (a node listing 100,000 GPUs, a CSV
field of a megabyte, a node name of a gigabyte) sets how long a command runs or how much
memory it takes. Each bound is far above any real cluster or published trace (Alibaba's openb:
1,523 nodes, 8,152 pods; a GPU node holds 8, at most 16) and is reported as one line naming
the file, the place and the bound.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_FILE_BYTES = 1 << 30  # a snapshot or trace file: 1 GiB (a week of 1,000 × 8 GPUs is ~0.3)
MAX_NODES = 100_000
MAX_NODE_GPUS = 64  # GPUs one node holds, or one task asks for on one node
MAX_ALLOCATIONS = 5_000_000  # tasks in a snapshot, pods in a trace
MAX_USAGE_POINTS = 100_000_000  # a snapshot's usage history: samples × GPUs
MAX_TEXT = 4096  # characters of one name, id, label or CSV field
MAX_CSV_FIELD = 128 * 1024  # Python's csv default: a longer field is refused, not read


class InputTooLarge(ValueError):
    """A file, or a count or field in it, over its bound; the message is one line."""


def check_file_size(path: str | os.PathLike[str], what: str = "file") -> None:
    """InputTooLarge before a file over `MAX_FILE_BYTES` is read (OSError is the caller's)."""
    size = Path(path).stat().st_size
    if size > MAX_FILE_BYTES:
        raise InputTooLarge(
            f"{path}: {what} of {size / 2**20:,.0f} MiB, over the {MAX_FILE_BYTES >> 20:,} MiB "
            "an input file may have"
        )


def over(count: int, bound: int, what: str) -> str | None:
    """The problem text when `count` of `what` is above `bound`, else None."""
    if count <= bound:
        return None
    return f"{count:,} {what}, at most {bound:,}"
