"""`gpu-defrag forecast INPUT --idle 1,4,8 [--risk R] [--out FILE]`: the idle-window table
(`advisor.forecast.idle_windows`) as CSV instead of the demand forecast, with the windows and the
risk asked for; bad flags and an input without capacity are one line, exit 2, nothing written."""

from io import StringIO

import pandas as pd
import pytest

from advisor.cli import main
from tests.advisor.test_forecast_cli import _long_csv

IDLE_COLUMNS = "series,window_h,risk,release,current_idle,rule,as_of"


def _table(text: str) -> pd.DataFrame:
    return pd.read_csv(StringIO(text))


def test_idle_writes_the_table_for_the_windows_and_risk_asked_for(tmp_path, capsys):
    path = _long_csv(tmp_path, days=12)  # short enough for the per-series rules: fast
    out = tmp_path / "idle.csv"
    assert main(["forecast", str(path), "--idle", "8,2,2", "--risk", "0.3", "--out", str(out)]) == 0
    assert capsys.readouterr().out == ""
    text = out.read_text()
    assert text.splitlines()[0] == IDLE_COLUMNS
    table = _table(text)
    assert sorted(set(table["window_h"])) == [2, 8] and len(table) == 2 * 2  # 2 series x 2 W
    assert set(table["risk"]) == {0.3}
    assert (table["release"] >= 0).all() and table["release"].notna().all()
    # the default risk is the library's 0.05, and the risk changes the releases
    assert main(["forecast", str(path), "--idle", "2,8"]) == 0
    default = _table(capsys.readouterr().out)
    assert set(default["risk"]) == {0.05}
    assert not default["release"].equals(table["release"])


def test_idle_out_dash_is_standard_output(tmp_path, capsys, monkeypatch):
    path = _long_csv(tmp_path, days=12)
    monkeypatch.chdir(tmp_path)
    args = ["forecast", str(path), "--idle", "1"]
    assert main([*args, "--out", "-"]) == 0
    dashed = capsys.readouterr().out
    assert main(args) == 0
    assert dashed == capsys.readouterr().out and dashed.startswith(IDLE_COLUMNS)
    assert not (tmp_path / "-").exists()


def test_a_failed_idle_write_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    import errno

    import gpu_defrag_common.files

    def full(*_args, **_kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    path = _long_csv(tmp_path, days=12)
    out = tmp_path / "idle.csv"
    monkeypatch.setattr(gpu_defrag_common.files, "write_text_atomic", full)
    assert main(["forecast", str(path), "--idle", "1", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"gpu-defrag forecast: error: --out {out}: cannot write: No space left on device"
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--idle", "0"], "--idle"),
        (["--idle", "169"], "--idle"),
        (["--idle", "1.5"], "--idle"),
        (["--idle", "4h"], "--idle"),
        (["--idle", ""], "--idle"),
        (["--idle=-1"], "--idle"),
        (["--idle", "1", "--risk", "0"], "--risk"),
        (["--idle", "1", "--risk", "1"], "--risk"),
        (["--idle", "1", "--risk", "nan"], "--risk"),
        (["--idle", "1", "--risk", "5%"], "--risk"),
    ],
)
def test_a_bad_idle_flag_is_one_error_line_before_any_work(
    tmp_path, capsys, monkeypatch, args, flag
):
    import advisor.forecast.io as io

    path = _long_csv(tmp_path, days=12)
    out = tmp_path / "idle.csv"
    monkeypatch.setattr(io, "load", lambda *_a, **_k: pytest.fail("the input was read"))
    with pytest.raises(SystemExit) as stop:
        main(["forecast", str(path), *args, "--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith(f"gpu-defrag forecast: error: argument {flag}: ")
    assert not out.exists()


def test_risk_without_idle_is_refused_not_ignored(tmp_path, capsys, monkeypatch):
    import advisor.forecast.io as io

    path = _long_csv(tmp_path, days=12)
    monkeypatch.setattr(io, "load", lambda *_a, **_k: pytest.fail("the input was read"))
    assert main(["forecast", str(path), "--risk", "0.1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        captured.err
        == "gpu-defrag forecast: error: --risk is the idle windows' risk: it needs --idle\n"
    )


def test_an_input_without_capacity_is_one_line_and_writes_nothing(tmp_path, capsys):
    frame = pd.read_csv(_long_csv(tmp_path, days=12)).drop(columns="capacity")
    path = tmp_path / "nocap.csv"
    frame.to_csv(path, index=False)
    out = tmp_path / "idle.csv"
    for extra in (["--out", str(out)], []):
        assert main(["forecast", str(path), "--idle", "1,4", *extra]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.count("\n") == 1
        assert captured.err.startswith(f"gpu-defrag forecast: error: {path}: no capacity")
        assert "idle = capacity - use" in captured.err
        assert not out.exists()
    # the demand forecast of the same input needs no capacity
    assert main(["forecast", str(path), "--horizons", "1", "--model", "naive"]) == 0
