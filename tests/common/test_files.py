"""Whole-or-nothing writes: a link is written through, a FIFO is not replaced, and a staged
result folder never mixes two runs' files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpu_defrag_common.files import (
    MANIFEST,
    check_directory_target,
    check_file_target,
    staged_directory,
    write_text_atomic,
)


def test_a_symlink_is_written_through_to_its_target(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real.name)
    write_text_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_a_dangling_symlink_creates_the_file_it_names(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to("made.json")
    write_text_atomic(link, "new")
    assert link.is_symlink() and (tmp_path / "made.json").read_text() == "new"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_written_to_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so the writer's open returns
    try:
        write_text_atomic(fifo, "through the pipe")
        assert os.read(reader, 100) == b"through the pipe"
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_a_failed_write_raises_its_own_error_not_the_cleanups(tmp_path: Path, monkeypatch) -> None:
    def full(*_args) -> None:
        raise OSError(28, "No space left on device")

    def broken_unlink(self: Path, missing_ok: bool = False) -> None:
        raise NotADirectoryError(20, "Not a directory", str(self))

    monkeypatch.setattr(os, "replace", full)
    monkeypatch.setattr(Path, "unlink", broken_unlink)
    with pytest.raises(OSError) as error:
        write_text_atomic(tmp_path / "x.json", "text")
    assert error.value.errno == 28


def _run(target: Path, files: dict[str, str]) -> None:
    with staged_directory(target) as stage:
        for name, text in files.items():
            (stage / name).write_text(text)


def test_a_new_run_replaces_the_previous_runs_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(out, {"curve.csv": "1", "migration.png": "old plot"})
    _run(out, {"curve.csv": "2"})
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "curve.csv"]
    assert (out / "curve.csv").read_text() == "2"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no stage or old folder left


def test_files_that_are_not_the_writers_stay(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(out, {"curve.csv": "1", "migration.png": "old plot"})
    (out / "notes.txt").write_text("mine")
    _run(out, {"curve.csv": "2"})
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "curve.csv", "notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


def test_a_failed_run_keeps_the_previous_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(out, {"curve.csv": "1"})
    with pytest.raises(RuntimeError), staged_directory(out) as stage:
        (stage / "curve.csv").write_text("half")
        raise RuntimeError("plot failed")
    assert (out / "curve.csv").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_symlinked_folder_is_swapped_behind_the_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to("real")
    _run(link, {"a.csv": "1"})
    assert link.is_symlink() and (tmp_path / "real" / "a.csv").read_text() == "1"


def test_a_file_in_the_way_is_refused_before_the_block_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_text("keep me")
    ran = []
    with pytest.raises(NotADirectoryError, match="not a directory"), staged_directory(out):
        ran.append(True)
    assert not ran and out.read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_the_working_directory_is_written_into_not_swapped(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "out"
    _run(out, {"a.csv": "1", "b.png": "old"})
    inode = out.stat().st_ino
    monkeypatch.chdir(out)
    _run(Path("."), {"a.csv": "2"})
    assert Path.cwd().stat().st_ino == inode  # the shell's folder still exists
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "a.csv"]


def _unwritable(monkeypatch, folder: Path) -> None:
    """`folder` read-only, as any user but root (who writes anywhere) sees it."""
    folder.chmod(0o555)
    if os.geteuid() == 0:
        access = os.access
        monkeypatch.setattr(
            os, "access", lambda p, mode, **kw: Path(p) != folder and access(p, mode, **kw)
        )


@pytest.mark.parametrize(
    ("below", "error", "why"),
    [
        ("out", PermissionError, "{locked} is not writable"),
        ("new/deeper/out", PermissionError, "{locked} is not writable"),  # cannot be made
        ("afile/out", NotADirectoryError, "{locked}/afile is not a directory"),
        ("afile", NotADirectoryError, "exists and is not a directory"),
    ],
)
def test_a_folder_that_cannot_be_written_is_refused_before_the_block_runs(
    tmp_path: Path, monkeypatch, below: str, error: type, why: str
) -> None:
    locked = tmp_path.resolve() / "locked"
    locked.mkdir()
    (locked / "afile").write_text("keep me")
    _unwritable(monkeypatch, locked)
    ran = []
    with pytest.raises(error) as info, staged_directory(locked / below):
        ran.append(True)
    assert not ran and info.value.strerror == why.format(locked=locked)
    assert info.value.filename == str(locked / below)
    assert [p.name for p in locked.iterdir()] == ["afile"]


def test_a_folders_missing_parents_are_fine_where_they_can_be_made(tmp_path: Path) -> None:
    assert check_directory_target(tmp_path / "new" / "deeper" / "out") is None
    assert not (tmp_path / "new").exists()  # the check makes nothing


def test_a_linked_folder_is_checked_where_it_is_written(tmp_path: Path, monkeypatch) -> None:
    """The stage goes beside the folder behind the link, so that is the parent that counts."""
    locked = tmp_path.resolve() / "locked"
    (locked / "real").mkdir(parents=True)
    (tmp_path / "link").symlink_to(locked / "real")
    _unwritable(monkeypatch, locked)
    with pytest.raises(PermissionError, match="locked is not writable"):
        check_directory_target(tmp_path / "link")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "link").symlink_to(tmp_path / "other" / "out")  # dangling: made there
    assert check_directory_target(tmp_path / "other" / "link") is None


@pytest.mark.parametrize(
    ("name", "error", "why"),
    [
        ("x.csv", PermissionError, "{locked} is not writable"),
        ("nodir/x.csv", FileNotFoundError, "{locked}/nodir does not exist"),
        ("afile/x.csv", NotADirectoryError, "{locked}/afile is not a directory"),
        ("sub", IsADirectoryError, "is a directory"),
    ],
)
def test_a_file_that_cannot_be_written_is_refused(
    tmp_path: Path, monkeypatch, name: str, error: type, why: str
) -> None:
    locked = tmp_path.resolve() / "locked"
    (locked / "sub").mkdir(parents=True)
    (locked / "afile").write_text("keep me")
    _unwritable(monkeypatch, locked)
    with pytest.raises(error) as info:
        check_file_target(locked / name)
    assert info.value.strerror == why.format(locked=locked)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_in_a_read_only_folder_can_still_be_written(tmp_path: Path, monkeypatch) -> None:
    """It is written to as it is, not replaced, so its folder need not be writable; as a
    folder target it is in the way."""
    locked = tmp_path.resolve() / "locked"
    locked.mkdir()
    os.mkfifo(locked / "pipe")
    _unwritable(monkeypatch, locked)
    assert stat.S_ISFIFO(check_file_target(locked / "pipe"))
    with pytest.raises(NotADirectoryError, match="exists and is not a directory"):
        check_directory_target(locked / "pipe")
