"""`gpu-defrag backtest` on a small long-format file writes the files with the exact columns."""

import numpy as np
import pandas as pd
import pytest

from advisor.cli import main
from tests.factories import demand_panel

METRIC_COLUMNS = "series,horizon,model,mae,rmse,wape,smape,mase,pinball_q90,coverage_q90"


def _long_csv(tmp_path, days: int = 21):
    """Two synthetic series of `days` hourly values with capacity, as the long CSV format."""
    p = demand_panel(days=days, series=2, seed=3)
    frame = p.values.stack().rename("value").reset_index()
    frame.columns = ["time", "series", "value"]
    frame["capacity"] = p.capacity.stack().to_numpy()
    frame = frame.drop(index=frame.index[100:110])  # a gap, masked by the reader
    path = tmp_path / "demand.csv"
    frame.to_csv(path, index=False)
    return path


def test_backtest_cli_writes_metrics_decisions_and_plot(tmp_path, capsys):
    path = _long_csv(tmp_path)
    out = tmp_path / "out"
    rc = main(
        [
            "backtest",
            str(path),
            "--horizons",
            "1,24",
            "--quantiles",
            "0.5,0.9",
            "--test-from",
            "2024-01-20",
            "--test-to",
            "2024-01-21",
            "--replays",
            "idle",
            "--windows",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    header = (out / "metrics.csv").read_text().splitlines()[0]
    assert header == METRIC_COLUMNS
    metrics = pd.read_csv(out / "metrics.csv")
    models = set(metrics["model"])
    assert {
        "advisor",
        "naive",
        "seasonal_naive_24",
        "seasonal_naive_168",
        "same_hour_mean_7d",
        "holt_winters",
    } <= models
    assert set(metrics["horizon"]) == {1, 24}
    assert np.isfinite(metrics["mae"]).all()
    decisions = pd.read_csv(out / "decisions.csv")
    assert {"replay", "series", "window_h", "model", "capture", "violation_rate"} <= set(
        decisions.columns
    )
    assert set(decisions["model"]) >= {"advisor", "half_min_past_w"}
    assert set(decisions["replay"]) == {"idle_window"}  # only the replays asked for
    assert (out / "forecast.png").stat().st_size > 1000
    full = pd.read_csv(out / "metrics_full.csv")
    assert (full["headroom_q90"] >= 0).all() and "headroom_q50" not in full
    paired = pd.read_csv(out / "significance.csv")
    assert set(paired["horizon"]) == {1, 24} and "naive" in set(paired["baseline"])
    assert paired.groupby(["series", "horizon"])["best_baseline"].sum().eq(1).all()
    # the upper quantile's coverage and pinball, each as metrics.csv has it, with their intervals
    intervals = pd.read_csv(out / "interval_significance.csv").set_index(["series", "horizon"])
    scored = metrics.set_index(["series", "horizon", "model"])
    assert set(intervals["level"]) == {0.9} and len(intervals) == 2 * metrics["series"].nunique()
    for (series, h), row in intervals.iterrows():
        assert row["coverage"] == pytest.approx(scored.loc[(series, h, "advisor"), "coverage_q90"])
        assert row["pinball_baseline"] == pytest.approx(
            scored.loc[(series, h, "naive"), "pinball_q90"]
        )
        # a one-day test part leaves no day to resample: no interval rather than a false one
        assert row["days"] == 1 and np.isnan(row["coverage_lo"]) and np.isnan(row["boot_hi_pct"])
    printed = capsys.readouterr().out
    assert "advisor" in printed and "paired tests of the advisor's MAE" in printed
    assert "upper quantiles against naive + empirical quantile" in printed


def test_the_idle_replay_in_its_second_process_writes_what_a_run_here_gives(tmp_path, capsys):
    """The CLI runs the idle-window replay beside the demand backtest, in a worker process; its
    rows are exactly those of `idle.backtest` called here, and no worker is left behind."""
    import multiprocessing

    from advisor.forecast import idle, io

    path = _long_csv(tmp_path)
    out = tmp_path / "out"
    args = ["backtest", str(path), "--horizons", "1", "--test-from", "2024-01-18"]
    assert main([*args, "--replays", "idle", "--windows", "1,4", "--out", str(out)]) == 0
    written = pd.read_csv(out / "decisions.csv")
    here = idle.backtest(io.load(str(path)), (1, 4), 0.05, "2024-01-18", None, intervals=True)
    assert {"capture_lo", "violation_hi"} <= set(here.columns)
    assert len(here) and set(here["window_h"]) == {1, 4}
    here.to_csv(tmp_path / "here.csv", index=False)
    pd.testing.assert_frame_equal(written, pd.read_csv(tmp_path / "here.csv"))
    assert multiprocessing.active_children() == []


def test_a_failed_demand_backtest_stops_the_idle_replay_worker(tmp_path, capsys):
    """h = 168 has no test origin to score: one line, exit 2, and the idle replay started beside
    it is ended, not left running to finish for nobody."""
    import multiprocessing

    path = _long_csv(tmp_path)
    assert main(["backtest", str(path), "--horizons", "168", "--out", str(tmp_path / "o")]) == 2
    assert "no test origin" in capsys.readouterr().err
    assert multiprocessing.active_children() == []
    assert not (tmp_path / "o").exists()


def test_the_reservation_replay_costs_the_upper_quantile(tmp_path, capsys):
    """Reserving at the P90: units held above use and hours short, per series, horizon and model,
    consistent with the forecasts the run wrote; skipped with a line when no upper quantile."""
    path = _long_csv(tmp_path)
    out = tmp_path / "out"
    args = ["backtest", str(path), "--horizons", "1", "--test-from", "2024-01-20"]
    args += ["--replays", "reservation", "--quantiles", "0.5,0.8", "--out", str(out)]
    assert main(args) == 0
    decisions = pd.read_csv(out / "decisions.csv")
    fc = pd.read_csv(out / "forecasts.csv")
    assert set(decisions["replay"]) == {"reservation"} and set(decisions["quantile"]) == {0.8}
    assert len(decisions) == fc.groupby(["series", "horizon", "model"]).ngroups
    row = decisions[(decisions["model"] == "advisor")].iloc[0]
    g = fc[(fc["model"] == "advisor") & (fc["series"] == row["series"])].dropna(subset=["actual"])
    assert row["hours"] == len(g)
    held = (g["q0.8"] - g["actual"]).clip(0).sum()
    assert row["reserved_idle_unit_hours"] == pytest.approx(held, rel=1e-9)
    assert row["short_hours"] == (g["actual"] > g["q0.8"]).sum()
    assert "reservation cost at q = 0.8" in capsys.readouterr().out
    metrics = pd.read_csv(out / "metrics_full.csv")
    advisor = metrics[(metrics["model"] == "advisor") & (metrics["series"] == row["series"])]
    assert advisor["headroom_q80"].iloc[0] * len(g) == pytest.approx(held, rel=1e-9)
    args[-3:] = ["0.5", "--out", str(tmp_path / "none")]
    assert main(args) == 0
    assert "reservation replay skipped" in capsys.readouterr().out


def test_forecast_cli_prints_ordered_quantiles(tmp_path, capsys):
    path = _long_csv(tmp_path)
    assert main(["forecast", str(path), "--horizons", "1,2", "--model", "naive"]) == 0
    from io import StringIO

    frame = pd.read_csv(StringIO(capsys.readouterr().out))
    assert len(frame) == 4
    assert (frame["q0.1"] <= frame["q0.5"]).all() and (frame["q0.5"] <= frame["q0.9"]).all()
    assert (frame["q0.9"] <= frame["capacity"]).all()


def test_unreadable_inputs_are_one_line_and_write_nothing(tmp_path, capsys):
    """Missing file, wrong columns, unparsable values, an unreachable Prometheus: exit 2, one
    line naming the input, and the output folder is not created."""
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n")
    philly = tmp_path / "philly_node_sequence.csv"
    philly.write_text("time,active,total\n2017-10-03 00:00:00,abc,420\n")
    timeless = tmp_path / "openb_pod_list_multigpu20.csv"
    timeless.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np-0,1000,1,1,1000\n")
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0::/root:/bin/sh\nbin:x:1:1::/:/bin/sh\npg:x:2:2:A,,,:/:/bin/sh\n")
    out = tmp_path / "out"
    for source, words in [
        (str(tmp_path / "missing.csv"), "No such file"),
        (str(passwd), "not a CSV of the long format (time,series,value[,capacity]), Philly, "),
        (str(timeless), "no times to forecast"),
        (str(wrong), "missing"),
        (str(philly), "active 'abc' in row 1 is not a number"),
        ("prometheus+http://127.0.0.1:9/?query=up", "unreachable"),
    ]:
        rc = main(["backtest", source, "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert rc == 2
        assert len(err.splitlines()) == 1, err
        assert err.startswith(f"gpu-defrag backtest: error: {source}: ") and words in err
        assert not out.exists()
    assert main(["forecast", str(wrong)]) == 2
    assert capsys.readouterr().err.startswith(f"gpu-defrag forecast: error: {wrong}: ")


def test_a_short_history_gets_naive_as_the_unvalidated_advisor(tmp_path, capsys):
    """Too little training to validate anything: the advisor is naive, flagged, and every file
    is still written (a held-back series may be short)."""
    p = demand_panel(days=9, series=1, seed=5)
    frame = p.values.stack().rename("value").reset_index()
    frame.columns = ["time", "series", "value"]
    path = tmp_path / "short.csv"
    frame.to_csv(path, index=False)
    out = tmp_path / "out"
    assert main(["backtest", str(path), "--replays", "", "--out", str(out)]) == 0
    picks = pd.read_csv(out / "picks.csv")
    assert set(picks["pick"]) == {"naive"} and not picks["validated"].any()
    metrics = pd.read_csv(out / "metrics.csv").set_index(["horizon", "model"])
    for h in (1, 24):
        assert metrics.loc[(h, "advisor"), "mae"] == metrics.loc[(h, "naive"), "mae"]
    assert (out / "forecast.png").exists()


def test_a_failed_run_leaves_the_previous_results_whole(tmp_path, monkeypatch):
    """The plot fails after the CSVs are rendered: the folder still holds the last good run."""
    import advisor.forecast.plot as plot

    path = _long_csv(tmp_path)
    out = tmp_path / "out"
    args = ["backtest", str(path), "--horizons", "1", "--replays", "", "--out", str(out)]
    args += ["--test-from", "2024-01-20", "--test-to", "2024-01-21"]
    assert main(args) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}

    def broken(*_args, **_kw):
        raise RuntimeError("no plot today")

    monkeypatch.setattr(plot, "plot_backtest", broken)
    try:
        main([*args[:-4], "--test-from", "2024-01-19", "--test-to", "2024-01-20"])
    except RuntimeError:
        pass
    else:
        raise AssertionError("the broken plot should have failed the run")
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".out.")] == []


def test_a_published_split_the_data_does_not_reach_falls_back_to_the_last_week():
    """A file in Philly's or Helios's format but of other dates: its reader's split is empty,
    so the last 7 days are tested; an explicit --test-from outside the data is an error."""
    from dataclasses import replace

    from advisor.forecast.errors import InputError
    from advisor.forecast.rolling import run, test_window

    p = demand_panel(days=30, series=1, seed=2)
    elsewhere = replace(p, test_from=pd.Timestamp("2017-12-01"), test_to=pd.Timestamp("2017-12-15"))
    origins = test_window(elsewhere)
    assert len(origins) == 7 * 24 and p.index[origins[-1]] == p.index[-1]
    assert (test_window(elsewhere) == test_window(p)).all()
    with pytest.raises(InputError, match="lies in the test part"):
        run(p, horizons=(1,), test_from="2030-01-01")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["forecast", "--quantiles", "1.5"], "--quantiles"),
        (["forecast", "--quantiles", "0"], "--quantiles"),
        (["forecast", "--quantiles=-0.1"], "--quantiles"),
        (["forecast", "--quantiles", "nan"], "--quantiles"),
        (["forecast", "--quantiles", "0.5,x"], "--quantiles"),
        (["forecast", "--model", "nope"], "--model"),
        (["forecast", "--horizons", ""], "--horizons"),
        (["forecast", "--horizons=-1"], "--horizons"),
        (["forecast", "--horizons", "100000"], "--horizons"),
        (["backtest", "--horizons=-1"], "--horizons"),
        (["backtest", "--horizons", "0"], "--horizons"),
        (["backtest", "--horizons", "1.5"], "--horizons"),
        (["backtest", "--test-from", "abc"], "--test-from"),
        (["backtest", "--test-to", "2024-13-45"], "--test-to"),
        (["backtest", "--windows", "0"], "--windows"),
        (["backtest", "--risk", "2"], "--risk"),
    ],
)
def test_a_bad_flag_is_one_error_line_before_any_work(tmp_path, capsys, monkeypatch, args, flag):
    """Quantiles outside (0, 1), horizons that are not 1…168 whole hours (0 or -1 would score the
    past), an unknown model, an unparseable date: argparse's error, exit 2, nothing read."""
    import advisor.forecast.io as io

    monkeypatch.setattr(io, "load", lambda *_a, **_k: pytest.fail("the input was read"))
    with pytest.raises(SystemExit) as stop:
        main([args[0], str(_long_csv(tmp_path)), *args[1:]])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith(f"gpu-defrag {args[0]}: error: argument {flag}: ")


def test_flags_at_their_bounds_parse():
    from advisor.cli import build_parser

    flags = ["--horizons", "168,1,1", "--quantiles", "0.9,0.01", "--test-to", "2024-05-08"]
    args = build_parser().parse_args(
        ["backtest", "x", *flags, "--test-from", "2024-05-01T02:00+02:00"]
    )
    assert args.horizons == (1, 168) and args.quantiles == (0.01, 0.9)
    assert args.test_from == pd.Timestamp("2024-05-01") and args.test_from.tzinfo is None
    assert build_parser().parse_args(["forecast", "x", "--model", "gbm"]).model == "gbm"


def test_an_unusable_out_is_one_line_before_the_run(tmp_path, capsys, monkeypatch):
    """A file's parent that is a file or missing, a folder given for a file, a file given for
    a folder: exit 2 at the start (the input is never read), and nothing is written."""
    import advisor.forecast.io as io

    path = _long_csv(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    monkeypatch.setattr(io, "load", lambda *_a, **_k: pytest.fail("the input was read"))
    for command, out, words in [
        ("forecast", afile / "x.csv", "is not a directory"),
        ("forecast", tmp_path / "nodir" / "x.csv", "does not exist"),
        ("forecast", tmp_path, "is a directory"),
        ("backtest", afile, "exists and is not a directory"),
        ("backtest", afile / "sub" / "out", "is not a directory"),
    ]:
        assert main([command, str(path), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"gpu-defrag {command}: error: --out {out}: ") and words in err, err
        assert len(err.splitlines()) == 1
    assert afile.read_text() == "keep me" and not (tmp_path / "nodir").exists()


def test_a_failed_write_is_one_line_and_keeps_the_previous_results(tmp_path, capsys, monkeypatch):
    """A full disk while writing: one line, exit 1, the previous files whole."""
    import errno

    import advisor.forecast.plot as plot
    import gpu_defrag_common.files

    def full(*_args, **_kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    path = _long_csv(tmp_path)
    out = tmp_path / "out"
    args = ["backtest", str(path), "--horizons", "1", "--replays", "", "--out", str(out)]
    args += ["--test-from", "2024-01-20", "--test-to", "2024-01-21"]
    assert main(args) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    capsys.readouterr()
    monkeypatch.setattr(plot, "plot_backtest", full)
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"gpu-defrag backtest: error: --out {out}: cannot write: No space left on device"
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before

    csv = tmp_path / "fc.csv"
    monkeypatch.setattr(gpu_defrag_common.files, "write_text_atomic", full)
    args = ["forecast", str(path), "--horizons", "1", "--model", "naive", "--out", str(csv)]
    assert main(args) == 1
    assert capsys.readouterr().err.strip().endswith("cannot write: No space left on device")
    assert not csv.exists()


def test_forecast_out_dash_is_standard_output_not_a_file_named_dash(tmp_path, capsys, monkeypatch):
    path = _long_csv(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["forecast", str(path), "--horizons", "1", "--model", "naive"]
    assert main([*args, "--out", "-"]) == 0
    dashed = capsys.readouterr().out
    assert main(args) == 0
    assert dashed == capsys.readouterr().out and dashed.startswith("series,")
    assert not (tmp_path / "-").exists()


def test_an_input_without_a_usable_hour_is_an_error_not_an_empty_table(tmp_path, capsys):
    """Ten readings a minute apart at the start of each hour: every hour holds less than half
    its minutes, so every hour is masked; the forecast would be all NaN."""
    times = [
        pd.Timestamp("2024-01-01") + pd.Timedelta(hours=h, minutes=m)
        for h in range(48)
        for m in range(10)
    ]
    path = tmp_path / "bursts.csv"
    pd.DataFrame({"time": times, "series": "a", "value": 3.0}).to_csv(path, index=False)
    assert main(["forecast", str(path), "--model", "naive"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"gpu-defrag forecast: error: {path}: no hour holds half")


def test_a_row_off_the_hourly_grid_still_forecasts(tmp_path, capsys):
    """One row a second late used to make the grid step a second and mask every hour."""
    frame = pd.read_csv(_long_csv(tmp_path))
    frame.loc[5, "time"] = str(pd.Timestamp(frame.loc[5, "time"]) + pd.Timedelta(seconds=1))
    path = tmp_path / "jitter.csv"
    frame.to_csv(path, index=False)
    assert main(["forecast", str(path), "--horizons", "1,2", "--model", "naive"]) == 0
    from io import StringIO

    table = pd.read_csv(StringIO(capsys.readouterr().out))
    assert len(table) == 4 and table[["q0.1", "q0.5", "q0.9"]].notna().all().all()


def test_backtest_and_forecast_json_carry_the_tables_rows(tmp_path, capsys):
    """`--json`: one JSON document on stdout, the tables as lists of rows (the files' columns),
    NaN as null; forecast's JSON has its CSV's rows."""
    import json

    path = _long_csv(tmp_path)
    args = ["backtest", str(path), "--horizons", "1", "--quantiles", "0.5,0.9"]
    args += ["--test-from", "2024-01-20", "--test-to", "2024-01-21", "--replays", "reservation"]
    assert main([*args, "--json", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {
        "metrics", "summary", "picks", "paired_tests", "interval_tests", "decisions", "notes",
        "seconds", "out",
    }  # fmt: skip
    assert ",".join(doc["metrics"][0]) == METRIC_COLUMNS
    assert {row["model"] for row in doc["metrics"]} >= {"advisor", "naive"}
    assert {row["horizon"] for row in doc["summary"]} == {1}
    assert {row["replay"] for row in doc["decisions"]} == {"reservation"}
    assert doc["interval_tests"][0]["coverage_lo"] is None  # one test day: no interval, not NaN
    assert doc["out"] is None and doc["seconds"]["total"] > 0
    forecast = ["forecast", str(path), "--horizons", "1,2", "--model", "naive", "--quiet"]
    assert main(forecast) == 0
    csv_rows = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
    assert main([*forecast, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == len(csv_rows) and list(rows[0]) == list(csv_rows.columns)
