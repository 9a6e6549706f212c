"""Whole-or-nothing file writes, for every file the project produces (snapshots, generated rules
and dashboards): the text goes to a temporary file beside the target, which is renamed over the
target only once complete, so a crash or a full disk never leaves half a file behind."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The names a staged result folder was given by its writer, so the next run knows which files
# are its own (to drop the ones it no longer makes) and which are someone else's (to keep).
MANIFEST = ".gpu-defrag-files"


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` whole or not at all.

    A symlink is written through: the file it points to is replaced (atomically) and the link
    stays a link. A target that exists and is not a regular file (a FIFO, a device such as
    /dev/stdout, a socket) cannot be replaced without destroying it, so the text is written to
    it directly, as a shell redirection would; whole-or-nothing cannot hold there."""
    mode = _mode(Path(path))
    if mode is not None and not stat.S_ISREG(mode):
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
        return
    target = Path(os.path.realpath(path))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # same directory: atomic rename
    try:
        with open(tmp, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):  # a failing cleanup must not hide the real error
            tmp.unlink(missing_ok=True)
        raise


def _mode(path: Path) -> int | None:
    """The mode of what `path` names, links followed; None when nothing is there yet."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


def check_directory_target(target: str | Path) -> int | None:
    """Raise OSError when `target` cannot become a result folder, so a command can say so
    before hours of work, not after; returns the mode of what is there (None: nothing yet).

    The error's `strerror` is one line saying why, its `filename` the target: it exists and is
    not a folder (a file, a FIFO; a link counts as what it points to), or the folder it would
    be written beside (behind a link, as `staged_directory` writes it) is not a directory or
    not writable. Missing parents are made when the folder is written, so the first one that
    exists must be a writable directory."""
    mode = _target_mode(target)
    if mode is not None and not stat.S_ISDIR(mode):
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", str(target))
    parent = Path(os.path.realpath(target)).parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    _check_parent(target, parent)
    return mode


def check_file_target(target: str | Path) -> int | None:
    """Raise OSError when `target` cannot take a file written by `write_text_atomic`, as
    `check_directory_target` does for a folder; returns the mode of what is there.

    A folder there, or a file that is not writable, is refused. A FIFO or device (such as
    /dev/stdout) is written to as it is, so only it must be writable; anything else is written
    beside the file (behind a link), whose folder must exist and be writable."""
    mode = _target_mode(target)
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(target))
    if mode is not None and not os.access(target, os.W_OK):
        raise PermissionError(errno.EACCES, "is not writable", str(target))
    if mode is None or stat.S_ISREG(mode):
        _check_parent(target, Path(os.path.realpath(target)).parent)
    return mode


def _target_mode(target: str | Path) -> int | None:
    """`_mode`, with a path that runs through a file counting as nothing there yet: the check
    of its parent then names the file in the way."""
    try:
        return _mode(Path(target))
    except NotADirectoryError:
        return None


def _check_parent(target: str | Path, parent: Path) -> None:
    """Raise OSError naming `parent` when the target cannot be written in it."""
    if not parent.is_dir():
        if parent.exists():
            raise NotADirectoryError(errno.ENOTDIR, f"{parent} is not a directory", str(target))
        raise FileNotFoundError(errno.ENOENT, f"{parent} does not exist", str(target))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"{parent} is not writable", str(target))


@contextmanager
def staged_directory(target: str | Path) -> Iterator[Path]:
    """Write a set of result files together: they go to a hidden folder beside `target`, which
    takes the place of `target` only when the whole block succeeds, so a failure part-way (a
    plot that cannot be drawn, a full disk) leaves the previous results as they were, never a
    mix of old and new.

    A folder that holds only a previous run's files is swapped whole (renamed aside, the new
    one renamed in, the old one removed), so no file of the previous run survives. A folder
    that also holds other files (or whose files no run recorded) keeps them: the new files are
    moved in and the previous run's files this run did not make are removed. A `target` that
    cannot be a result folder (`check_directory_target`) raises OSError before the block runs."""
    target = Path(os.path.realpath(target))  # a link to a folder: swap the folder behind it
    mode = check_directory_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = _fresh_folder(target)
    try:
        yield stage
        (stage / MANIFEST).write_text("".join(f"{p.name}\n" for p in sorted(stage.iterdir())))
        if mode is None:
            os.rename(stage, target)
        elif _swappable(target):
            _swap(stage, target)
        else:
            _merge(stage, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _fresh_folder(target: Path) -> Path:
    """A new hidden folder beside `target` (made with the umask's mode, unlike mkdtemp's 0700,
    because it becomes the result folder)."""
    folder = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
    folder.mkdir()
    return folder


def _recorded(folder: Path) -> set[str]:
    """The names the last staged run wrote into `folder` (empty if none did); only plain names,
    so an edited manifest cannot point outside the folder."""
    try:
        lines = (folder / MANIFEST).read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError):
        return set()
    return {n for n in lines if n not in ("", ".", "..") and "/" not in n and os.sep not in n}


def _swappable(folder: Path) -> bool:
    """True when every entry of `folder` is a previous run's (an empty folder counts) and it is
    not the working directory, which a swap would leave the shell standing in a deleted one."""
    if folder == Path(os.getcwd()):
        return False
    return {p.name for p in folder.iterdir()} <= _recorded(folder) | {MANIFEST}


def _swap(stage: Path, target: Path) -> None:
    """Put `stage` in the place of `target`; the old folder stays until the new one is in."""
    os.chmod(stage, stat.S_IMODE(target.stat().st_mode))
    old = _fresh_folder(target)
    os.rename(target, old)  # onto the new, empty folder: rename replaces it
    try:
        os.rename(stage, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _merge(stage: Path, target: Path) -> None:
    """Move the new files into a folder shared with other files; drop the previous run's
    files this run did not make (the manifest, moved last, records the new set)."""
    stale = _recorded(target) - {p.name for p in stage.iterdir()}
    for path in sorted(stage.iterdir(), key=lambda p: p.name == MANIFEST):
        os.replace(path, target / path.name)
    for name in stale:
        path = target / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
