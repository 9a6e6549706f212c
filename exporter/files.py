"""Whole-or-nothing file writes, for every file the project produces (snapshots, generated rules
and dashboards): the text goes to a temporary file beside the target, which is renamed over the
target only once complete, so a crash or a full disk never leaves half a file behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def staged_directory(target: str | Path) -> Iterator[Path]:
    """Write a set of result files together: they go to a hidden folder beside `target` and are
    moved into it only when the whole block succeeds, so a failure part-way (a plot that cannot
    be drawn, a full disk) leaves the previous results as they were, never a mix of old and new."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield stage
        target.mkdir(exist_ok=True)
        for path in sorted(stage.iterdir()):
            os.replace(path, target / path.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
