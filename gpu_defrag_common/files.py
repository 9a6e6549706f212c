"""Whole-or-nothing file writes, for every file the project produces (snapshots, generated rules
and dashboards): the text goes to a temporary file beside the target, which is renamed over the
target only once complete, so a crash or a full disk never leaves half a file behind."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

# The names a staged result folder was given, each with its writer (JSON), so the next run knows
# which files are its own (to drop the ones it no longer makes) and which are someone else's.
MANIFEST = ".gpu-defrag-files"
# The hidden folder a mount point's new files are staged in, inside it (the same file system).
_STAGE = ".gpu-defrag-stage"


def sync_generated(
    outputs: Mapping[str, tuple[Path, str]], label: str, command: str, check: bool
) -> int:
    """Bring generated files up to date, one line on what was done: `outputs` maps each file's
    name (as shown) to its path and text. A file whose text is already there is not rewritten.
    With `check` nothing is written: silent when current, as a linter is; else the stale names
    on stderr and exit status 1 (`command` says how to regenerate them)."""
    stale = [name for name, (path, text) in outputs.items() if not _holds(path, text)]
    current = [name for name in outputs if name not in stale]
    if check:
        if stale:
            print(f"out of date, run `{command}`: {', '.join(stale)}", file=sys.stderr)
        return 1 if stale else 0
    for name in stale:
        path, text = outputs[name]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
    up_to_date = f"{len(current)} file{'' if len(current) == 1 else 's'} up to date"
    if stale:
        print(f"{label}: wrote {', '.join(stale)}" + (f"; {up_to_date}" if current else ""))
    else:
        print(f"{label}: {up_to_date} ({', '.join(current)})")
    return 0


def _holds(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text(encoding="utf-8") == text


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` whole or not at all.

    A symlink is written through: the file it points to is replaced (atomically) and the link
    stays a link. A target that exists and is not a regular file (a FIFO, a device such as
    /dev/stdout, a socket) cannot be replaced without destroying it, so the text is written to
    it directly, as a shell redirection would; whole-or-nothing cannot hold there. A file that
    is replaced keeps its permission bits (set before the text is written)."""
    mode = _mode(Path(path))
    if mode is not None and not stat.S_ISREG(mode):
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
        return
    target = Path(os.path.realpath(path))
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # same directory: atomic rename
    try:
        with open(tmp, "w", encoding="utf-8") as stream:
            if mode is not None:  # a replaced file keeps its mode (a 0600 file stays private)
                os.fchmod(stream.fileno(), stat.S_IMODE(mode))
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


def check_directory_target(
    target: str | Path, names: Iterable[str] = (), writer: str | None = None
) -> int | None:
    """Raise OSError when `target` cannot become a result folder, so a command can say so
    before hours of work, not after; returns the mode of what is there (None: nothing yet).

    The error's `strerror` is one line saying why, its `filename` the target: it is an empty
    path, it exists and is not a folder (a file, a FIFO; a link counts as what it points to), or
    the folder it would be written beside (behind a link, as `staged_directory` writes it) is
    not a directory or not writable. Missing parents are made when the folder is written, so
    the first one that exists must be a writable directory. A mount point (a container's
    volume) is written in place, so it must be writable itself.

    `names`, the files the command will write (those it always writes), are checked against
    the folder's files: one that is there and was not written by `writer` (by default the
    calling module's name, as in `staged_directory`) is refused now, not after the work."""
    return _check_directory(target, names, writer or _caller_name())


def check_file_target(target: str | Path) -> int | None:
    """Raise OSError when `target` cannot take a file written by `write_text_atomic`, as
    `check_directory_target` does for a folder; returns the mode of what is there.

    An empty path, a folder there, or a file that is not writable, is refused. A FIFO or
    device (such as /dev/stdout) is written to as it is, so only it must be writable; anything
    else is written beside the file (behind a link), whose folder must exist and be writable."""
    _check_not_empty(target, "file")
    mode = _target_mode(target)
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(target))
    if mode is not None and not os.access(target, os.W_OK):
        raise PermissionError(errno.EACCES, "is not writable", str(target))
    if mode is None or stat.S_ISREG(mode):
        _check_parent(target, Path(os.path.realpath(target)).parent)
    return mode


def _check_directory(target: str | Path, names: Iterable[str], writer: str) -> int | None:
    _check_not_empty(target, "folder")
    mode = _target_mode(target)
    if mode is not None and not stat.S_ISDIR(mode):
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", str(target))
    real = Path(os.path.realpath(target))
    if mode is not None and os.path.ismount(real):
        _check_parent(target, real)  # written in place, not beside
    else:
        parent = real.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        _check_parent(target, parent)
    if mode is not None and names:
        # A manifest from before writers were recorded may be this command's: the write decides.
        owners, legacy = _manifest(real)
        ours = {n for n, w in owners.items() if w == writer or (legacy and w is None)}
        _refuse_clashes(target, real, set(names), ours)
    return mode


def _check_not_empty(target: str | Path, what: str) -> None:
    """An empty --out would be the working directory (Path('') is '.'): refused, not guessed."""
    if isinstance(target, str) and not target:
        raise FileNotFoundError(errno.ENOENT, f"an empty path names no {what}", target)


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


def _caller_name(depth: int = 2) -> str:
    """The module name of the function that called our caller: the default writer, so that two
    commands in different modules (backtest, replay) never take each other's files."""
    return str(sys._getframe(depth).f_globals.get("__name__") or "?")


def staged_directory(target: str | Path, writer: str | None = None) -> AbstractContextManager[Path]:
    """Write a set of result files together: they go to a hidden folder beside `target`, which
    takes the place of `target` only when the whole block succeeds, so a failure part-way (a
    plot that cannot be drawn, a full disk) leaves the previous results as they were, never a
    mix of old and new.

    `writer` names the command writing (by default the calling module's name); the folder's
    manifest records which writer wrote each file. Only this writer's files from an earlier
    run are its own: those it makes again are replaced, those it no longer makes are removed.
    Every other file (another command's, the user's) stays; one with the name of a file this
    run makes is refused (FileExistsError, one line) with nothing changed.

    A folder that holds only this writer's files is swapped whole (renamed aside, the new one
    renamed in, the old one removed). A folder that also holds other files, the working
    directory, or a mount point (or a folder whose rename fails with EBUSY or EXDEV) is written
    in place: the new files are first brought beside their names (staged inside a mount point,
    copied across file systems) and only then renamed over them, so a failure before that
    leaves the folder as it was. A replaced file keeps its permission bits. A `target` that
    cannot be a result folder (`check_directory_target`) raises OSError before the block runs."""
    return _staged(target, writer or _caller_name())


@contextmanager
def _staged(target: str | Path, writer: str) -> Iterator[Path]:
    mode = _check_directory(target, (), writer)
    target = Path(os.path.realpath(target))  # a link to a folder: swap the folder behind it
    in_place = mode is not None and os.path.ismount(target)  # a volume cannot be renamed
    if in_place:
        stage = _fresh_folder(target / f"{_STAGE}.{uuid.uuid4().hex}")
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        stage = _fresh_folder(_beside(target))
    try:
        yield stage
        names = {p.name for p in stage.iterdir()} - {MANIFEST}
        if mode is None:
            _write_manifest(stage, dict.fromkeys(names, writer))
            os.rename(stage, target)
            return
        owners = _owners(target, writer, names)
        ours = {n for n, w in owners.items() if w == writer}
        _refuse_clashes(target, target, names, ours)
        if in_place or not _swappable(target, ours) or not _swap(stage, target, names, writer):
            _merge(stage, target, names, writer, owners)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _beside(target: Path) -> Path:
    """A new hidden name beside `target`, in its folder (a rename to or from it is atomic)."""
    return target.with_name(f".{target.name}.{uuid.uuid4().hex}")


def _fresh_folder(folder: Path) -> Path:
    """Make the new hidden folder `folder` (with the umask's mode, unlike mkdtemp's 0700,
    because it becomes the result folder)."""
    folder.mkdir()
    return folder


def _manifest(folder: Path) -> tuple[dict[str, str | None], bool]:
    """Name -> writer for the files in `folder` that a staged run recorded, and whether the
    manifest predates writers (a list of names, writer None). Only plain names that are still
    there count, so an edited manifest cannot point outside the folder."""
    try:
        text = (folder / MANIFEST).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}, False
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    files = doc.get("files") if isinstance(doc, dict) else None
    if isinstance(files, dict):
        legacy = False
        entries = {n: w if isinstance(w, str) else None for n, w in files.items()}
    else:
        legacy = True
        entries = dict.fromkeys(text.split("\n"))
    return {
        n: w
        for n, w in entries.items()
        if isinstance(n, str)
        and n not in ("", ".", "..", MANIFEST)
        and "/" not in n
        and os.sep not in n
        and os.path.lexists(folder / n)
    }, legacy


def _owners(folder: Path, writer: str, names: set[str]) -> dict[str, str | None]:
    """`_manifest`'s writers, with a manifest from before writers were recorded given to
    `writer` when this run makes every file it lists again (a re-run of the same command;
    another command's set differs), so upgrading does not refuse a plain re-run."""
    owners, legacy = _manifest(folder)
    if legacy and set(owners) <= names:
        return dict.fromkeys(owners, writer)
    return owners


def _refuse_clashes(target: str | Path, folder: Path, names: set[str], ours: set[str]) -> None:
    """FileExistsError when a file this run makes is already in `folder` and is not `ours`."""
    clash = sorted(n for n in names if n not in ours and os.path.lexists(folder / n))
    if clash:
        many = len(clash) > 1
        raise FileExistsError(
            errno.EEXIST,
            f"{', '.join(clash)} {'are' if many else 'is'} already there and"
            f" {'were' if many else 'was'} not written by this command; move"
            f" {'them' if many else 'it'} away or write elsewhere",
            str(target),
        )


def _write_manifest(stage: Path, owners: dict[str, str | None]) -> None:
    doc = {"files": dict(sorted(owners.items()))}
    (stage / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def _swappable(folder: Path, ours: set[str]) -> bool:
    """True when every entry of `folder` is this writer's (an empty folder counts) and it is
    not the working directory, which a swap would leave the shell standing in a deleted one."""
    if folder == Path(os.getcwd()):
        return False
    return {p.name for p in folder.iterdir()} <= ours | {MANIFEST}


def _swap(stage: Path, target: Path, names: set[str], writer: str) -> bool:
    """Put `stage` in the place of `target`; the old folder stays until the new one is in.
    False, with nothing changed, when `target` cannot be renamed (a mount point that
    `os.path.ismount` missed, such as a bind mount of a folder of the same file system)."""
    _write_manifest(stage, dict.fromkeys(names, writer))
    os.chmod(stage, stat.S_IMODE(target.stat().st_mode))
    for path in stage.iterdir():
        _keep_mode(target / path.name, path)
    old = _fresh_folder(_beside(target))
    try:
        os.rename(target, old)  # onto the new, empty folder: rename replaces it
    except BaseException as error:
        with contextlib.suppress(OSError):
            old.rmdir()
        if isinstance(error, OSError) and error.errno in (errno.EBUSY, errno.EXDEV):
            return False
        raise
    try:
        os.rename(stage, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return True


def _merge(
    stage: Path, target: Path, names: set[str], writer: str, owners: dict[str, str | None]
) -> None:
    """Write the new files into a folder shared with other files: each is first brought into
    `target` under a hidden name (renamed, or copied from another file system), and only once
    all are there renamed over its name, the manifest last; then this writer's files from
    before that this run did not make are removed. Other writers' files stay, as recorded."""
    for name in names:
        if (target / name).is_dir() and not (target / name).is_symlink():
            raise IsADirectoryError(errno.EISDIR, f"{name} is a directory", str(target))
    kept = {n: w for n, w in owners.items() if w != writer}
    _write_manifest(stage, {**kept, **dict.fromkeys(names, writer)})
    stale = {n for n, w in owners.items() if w == writer} - names
    moved: list[tuple[Path, Path]] = []
    try:
        for path in sorted(stage.iterdir(), key=lambda p: (p.name == MANIFEST, p.name)):
            tmp = target / f".{path.name}.{uuid.uuid4().hex}.tmp"
            moved.append((tmp, target / path.name))
            _move(path, tmp)
            _keep_mode(target / path.name, tmp)
        for tmp, final in moved:
            os.replace(tmp, final)
    finally:
        for tmp, _ in moved:
            _remove(tmp)
    for name in stale:
        _remove(target / name)


def _move(source: Path, destination: Path) -> None:
    """Rename `source` to `destination`, or copy it there when they are on two file systems."""
    try:
        os.rename(source, destination)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, destination, symlinks=True)
        else:
            shutil.copy2(source, destination, follow_symlinks=False)


def _keep_mode(old: Path, new: Path) -> None:
    """Give `new` the permission bits of the regular file `old` it is to replace, if any."""
    try:
        mode = os.lstat(old).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) and not new.is_symlink():
        os.chmod(new, stat.S_IMODE(mode))


def _remove(path: Path) -> None:
    """Remove what `path` names, if anything (a folder with what it holds, a link as a link)."""
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
