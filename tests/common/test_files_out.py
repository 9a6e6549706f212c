"""--out folders and files shared with others: a command replaces only what it wrote there
itself, a mount point is written in place, a replaced file keeps its mode, an empty path is
refused."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from gpu_defrag_common.files import (
    MANIFEST,
    check_directory_target,
    check_file_target,
    staged_directory,
    write_text_atomic,
)

BACKTEST = {"metrics.csv": "m", "summary.csv": "backtest summary", "forecast.png": "plot"}
REPLAY = {"curve.csv": "c", "summary.csv": "replay summary", "replay.png": "plot"}


def _run(target: Path, files_: dict[str, str], writer: str | None = None) -> None:
    with staged_directory(target, writer) as stage:
        for name, text in files_.items():
            (stage / name).write_text(text)


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _owners(folder: Path) -> dict[str, str]:
    return json.loads((folder / MANIFEST).read_text())["files"]


# ------------------------------------------------------------- 1. another command's files


@pytest.mark.parametrize("notes", [True, False], ids=["with-notes", "swappable"])
def test_a_second_command_with_a_clashing_name_is_refused_and_changes_nothing(
    tmp_path: Path, notes: bool
) -> None:
    out = tmp_path / "res2"
    _run(out, BACKTEST, "backtest")
    if notes:
        (out / "notes.txt").write_text("notes")
    before = _contents(out)
    with pytest.raises(FileExistsError) as info:
        _run(out, REPLAY, "replay")
    assert info.value.strerror == (
        "summary.csv is already there and was not written by this command;"
        " move it away or write elsewhere"
    )
    assert _contents(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["res2"]  # no stage or old folder left


@pytest.mark.parametrize("notes", [True, False], ids=["with-notes", "swappable"])
def test_two_commands_share_a_folder_each_replacing_only_its_own_files(
    tmp_path: Path, notes: bool
) -> None:
    out = tmp_path / "shared"
    _run(out, BACKTEST, "backtest")
    if notes:
        (out / "notes.txt").write_text("notes")
    _run(out, {"curve.csv": "c", "replay.png": "plot"}, "replay")
    assert (out / "summary.csv").read_text() == "backtest summary"
    assert (out / "metrics.csv").read_text() == "m" and (out / "curve.csv").read_text() == "c"
    _run(out, {"summary.csv": "second backtest"}, "backtest")  # no longer makes two files
    expected = [MANIFEST, "curve.csv", "replay.png", "summary.csv"] + ["notes.txt"] * notes
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)
    assert _owners(out) == {
        "curve.csv": "replay",
        "replay.png": "replay",
        "summary.csv": "backtest",
    }
    assert (out / "summary.csv").read_text() == "second backtest"
    assert [p.name for p in tmp_path.iterdir()] == ["shared"]


def test_a_users_own_file_of_the_same_name_is_not_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.csv").write_text("the user's")
    with pytest.raises(FileExistsError, match=r"summary\.csv is already there"):
        _run(out, REPLAY, "replay")
    assert _contents(out) == {"summary.csv": b"the user's"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_the_default_writer_is_the_calling_module(tmp_path: Path) -> None:
    """backtest and replay live in two modules: without a writer they still never take each
    other's files, while a re-run from the same module replaces its own."""

    def writer_in(module: str):
        namespace = {"__name__": module, "staged_directory": staged_directory}
        exec(  # a function whose module is `module`, as a CLI module's would be
            "def write(out, files):\n"
            "    with staged_directory(out) as stage:\n"
            "        for name, text in files.items():\n"
            "            (stage / name).write_text(text)\n",
            namespace,
        )
        return namespace["write"]

    out = tmp_path / "out"
    backtest, replay = writer_in("advisor.forecast.cli"), writer_in("advisor.replay.cli")
    backtest(out, BACKTEST)
    backtest(out, {**BACKTEST, "summary.csv": "again"})  # its own: replaced
    with pytest.raises(FileExistsError):
        replay(out, REPLAY)
    assert (out / "summary.csv").read_text() == "again"
    assert set(_owners(out).values()) == {"advisor.forecast.cli"}


def test_a_clash_is_refused_before_any_work_when_the_names_are_given(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run(out, BACKTEST, "backtest")
    with pytest.raises(FileExistsError, match=r"summary\.csv is already there") as info:
        check_directory_target(out, names=REPLAY, writer="replay")
    assert info.value.filename == str(out)
    assert check_directory_target(out, names=BACKTEST, writer="backtest") is not None
    assert check_directory_target(out, names=["curve.csv"], writer="replay") is not None


def _legacy(out: Path, names: list[str]) -> None:
    """A folder as the writer before writers were recorded left it: a list of names."""
    out.mkdir()
    for name in names:
        (out / name).write_text("old")
    (out / MANIFEST).write_text("".join(f"{n}\n" for n in names))


def test_a_manifest_from_before_writers_were_recorded(tmp_path: Path) -> None:
    """A re-run of the command that wrote it (it makes every file listed again) takes it
    over; another command's set does not, so its clash is refused."""
    rerun = tmp_path / "rerun"
    _legacy(rerun, sorted(BACKTEST))
    _run(rerun, BACKTEST, "backtest")
    assert (rerun / "summary.csv").read_text() == "backtest summary"
    assert set(_owners(rerun).values()) == {"backtest"}

    other = tmp_path / "other"
    _legacy(other, sorted(BACKTEST))
    before = _contents(other)
    with pytest.raises(FileExistsError, match=r"summary\.csv"):
        _run(other, REPLAY, "replay")
    assert _contents(other) == before
    check_directory_target(other, names=REPLAY, writer="replay")  # not refused before the work


# ------------------------------------------------------------- 2. a mount point


def _busy_rename(monkeypatch, busy: Path, code: int = errno.EBUSY) -> None:
    """`busy` cannot be renamed (a mount point), as the kernel answers for one."""
    rename = os.rename

    def fake(src, dst, *args, **kwargs):
        if Path(src) == busy:
            raise OSError(code, os.strerror(code), str(src))
        return rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", fake)


@pytest.mark.parametrize("code", [errno.EBUSY, errno.EXDEV])
def test_a_folder_that_cannot_be_renamed_is_written_in_place(
    tmp_path: Path, monkeypatch, code: int
) -> None:
    out = (tmp_path / "vol").resolve()
    _run(out, {"a.csv": "1", "b.png": "old"}, "backtest")
    inode = out.stat().st_ino
    _busy_rename(monkeypatch, out, code)
    _run(out, {"a.csv": "2"}, "backtest")
    assert out.stat().st_ino == inode
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "a.csv"]
    assert (out / "a.csv").read_text() == "2"
    assert [p.name for p in tmp_path.iterdir()] == ["vol"]  # no empty .vol.<uuid> left


def test_files_from_another_file_system_are_copied_in_whole_or_not_at_all(
    tmp_path: Path, monkeypatch
) -> None:
    """Each file is copied in under a hidden name first; a full disk part-way leaves the
    folder as it was, without half-copied files."""
    out = (tmp_path / "vol").resolve()
    _run(out, {"a.csv": "1", "b.csv": "1"}, "backtest")
    before = _contents(out)
    _busy_rename(monkeypatch, out)
    rename = os.rename

    def across(src, dst, *args, **kwargs):  # stage -> volume: another file system
        if Path(dst).parent == out and Path(src).parent != out:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", across)
    copy2, copies = shutil.copy2, []

    def full(src, dst, **kwargs):
        copies.append(dst)
        if len(copies) == 2:
            Path(dst).write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return copy2(src, dst, **kwargs)

    monkeypatch.setattr(shutil, "copy2", full)
    with pytest.raises(OSError, match="No space left"):
        _run(out, {"a.csv": "2", "b.csv": "2"}, "backtest")
    assert _contents(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["vol"]
    monkeypatch.setattr(shutil, "copy2", copy2)
    _run(out, {"a.csv": "3", "b.csv": "3"}, "backtest")
    assert (out / "a.csv").read_text() == (out / "b.csv").read_text() == "3"
    assert [p.name for p in tmp_path.iterdir()] == ["vol"]


def test_a_mount_point_is_staged_inside_itself_and_its_parent_need_not_be_writable(
    tmp_path: Path, monkeypatch
) -> None:
    """A volume mounted under a read-only root: the files are staged inside it."""
    locked = tmp_path.resolve() / "root"
    out = locked / "vol"
    out.mkdir(parents=True)
    (out / "user.txt").write_text("mine")
    locked.chmod(0o555)
    access = os.access
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == out)
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: Path(p) != locked and access(p, mode, **kw)
    )
    _busy_rename(monkeypatch, out)
    try:
        assert check_directory_target(out) is not None
        _run(out, BACKTEST, "backtest")
        with pytest.raises(RuntimeError), staged_directory(out, "backtest") as stage:
            (stage / "summary.csv").write_text("half")
            raise RuntimeError("plot failed")
        _run(out, {"summary.csv": "again"}, "backtest")
    finally:
        locked.chmod(0o755)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "summary.csv", "user.txt"]
    assert (out / "summary.csv").read_text() == "again"
    assert [p.name for p in locked.iterdir()] == ["vol"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="needs root to mount")
def test_a_real_tmpfs_mount_point(tmp_path: Path) -> None:
    out = tmp_path / "mnt"
    out.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(out)], check=False).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        for round_ in ("1", "2"):
            _run(out, {"a.csv": round_, "b.png": "plot"}, "backtest")
        assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "a.csv", "b.png"]
        assert (out / "a.csv").read_text() == "2"
        assert [p.name for p in tmp_path.iterdir()] == ["mnt"]
    finally:
        subprocess.run(["umount", str(out)], check=True)


# ------------------------------------------------------------- 3. a replaced file's mode


def test_an_overwritten_file_keeps_its_mode(tmp_path: Path) -> None:
    secret = tmp_path / "snapshot.json"
    secret.write_text("old")
    secret.chmod(0o600)
    write_text_atomic(secret, "new")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.read_text() == "new"
    fresh = tmp_path / "fresh.json"
    write_text_atomic(fresh, "x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask


@pytest.mark.parametrize("notes", [True, False], ids=["merged", "swapped"])
def test_a_result_folders_replaced_files_keep_their_modes(tmp_path: Path, notes: bool) -> None:
    out = tmp_path / "out"
    _run(out, {"a.csv": "1"}, "backtest")
    (out / "a.csv").chmod(0o600)
    if notes:
        (out / "notes.txt").write_text("notes")
    _run(out, {"a.csv": "2"}, "backtest")
    assert stat.S_IMODE((out / "a.csv").stat().st_mode) == 0o600
    assert (out / "a.csv").read_text() == "2"


# ------------------------------------------------------------- 4. an empty path


def test_an_empty_path_is_refused_in_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "summary.csv").write_text("keep")
    with pytest.raises(FileNotFoundError) as info:
        check_directory_target("")
    assert info.value.strerror == "an empty path names no folder"
    with pytest.raises(FileNotFoundError) as info:
        check_file_target("")
    assert info.value.strerror == "an empty path names no file"
    ran = []
    with pytest.raises(FileNotFoundError), staged_directory("", "replay") as stage:
        ran.append(stage)
    assert not ran
    assert _contents(tmp_path) == {"summary.csv": b"keep"}
