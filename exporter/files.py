"""Whole-or-nothing file writes, for every file the project produces (snapshots, generated rules
and dashboards): the text goes to a temporary file beside the target, which is renamed over the
target only once complete, so a crash or a full disk never leaves half a file behind."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: str | Path, text: str) -> None:
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # same directory: atomic rename
    try:
        with open(tmp, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
