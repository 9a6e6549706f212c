"""Bad forecast inputs are one line naming the file, the row and what is wrong (exit 2, nothing
written), for the Philly, Helios and openb readers as for the long format; results reach --out
before stdout; an --out that is the INPUT is refused; a horizon the test part cannot score and
a date past pandas' clock are one line too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from advisor.cli import main
from advisor.forecast import io, rolling
from advisor.forecast.errors import InputError
from tests.advisor.test_forecast_cli import _long_csv

ROOT = Path(__file__).resolve().parents[2]

PHILLY_HEADER = "time,active,total"
HELIOS_HEADER = "time,total_gpu_num,running_gpu_num,pending_gpu_num"
PODS_HEADER = "name,num_gpu,gpu_milli,creation_time,deletion_time,scheduled_time"


def _philly(tmp_path: Path, bad: str | None = None, at: int = 2, n: int = 240) -> Path:
    """A Philly file of `n` minutes; `bad` replaces the row at position `at` (row at + 1)."""
    times = pd.date_range("2017-10-03", periods=n, freq="min")
    rows = [f"{t:%Y-%m-%d %H:%M:%S},{300 + i % 7},420" for i, t in enumerate(times)]
    if bad is not None:
        rows[at] = bad
    path = tmp_path / "philly_node_sequence.csv"
    path.write_text("\n".join([PHILLY_HEADER, *rows]) + "\n")
    return path


def _one_line_error(source: Path | str, named: Path | str | None = None) -> str:
    """The one line `load(source)` raises, which starts with the file at fault (`named`, by
    default the source)."""
    with pytest.raises(InputError) as error:
        io.load(str(source))
    text = str(error.value)
    assert text.startswith(f"{named or source}: ") and "\n" not in text
    return text


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        # one row dated 1600 grew to 13 GB in 60 s; one dated 9999 asked for 31.3 GiB
        ("1600-10-03 01:39:00,300,420", "time '1600-10-03 01:39:00' in row 3 is outside the years"),
        ("9999-10-03 01:39:00,300,420", "time '9999-10-03 01:39:00' in row 3 is outside the years"),
        ("2017-10-03 00:02:00,-50,420", "active '-50' in row 3 is negative"),
        ("2017-10-03 00:02:00,inf,420", "active 'inf' in row 3 is infinite"),
        ("2017-10-03 00:02:00,1e308,420", "active '1e+308' in row 3 is above 1,000,000,000"),
        ("2017-10-03 00:02:00,300,-1", "total '-1' in row 3 is negative"),
        ("2017-10-03 00:02:00,5000,420", "active '5000' in row 3 is above its total 420"),
        ("2017-10-03 00:02:00", "row 3 has 1 of the header's 3 fields (cut short?)"),
        ("2017-10-03 00:02:00,300", "row 3 has 2 of the header's 3 fields (cut short?)"),
        ("2017-10-03 00:01:00,1,420", "row 3 repeats the time 2017-10-03 00:01:00 of row 2"),
        (
            "2027-10-03 00:02:00,300,420",
            "(the largest gap, 3,651.8 days, lies between row 240 (2017-10-03 03:59:00) and "
            "row 3 (2027-10-03 00:02:00)); is a date mistyped?",
        ),
    ],
)
def test_a_bad_philly_row_is_one_line_naming_it(tmp_path, bad, says):
    path = _philly(tmp_path, bad)
    assert says in _one_line_error(path)


def test_a_philly_row_repeated_exactly_is_harmless(tmp_path):
    """Only two different readings for one minute are refused; an exact copy reads as before."""
    clean = io.load(str(_philly(tmp_path)))
    path = tmp_path / "philly_node_sequence.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:4], lines[3], *lines[4:]]) + "\n")
    again = io.load(str(path))
    pd.testing.assert_frame_equal(again.values, clean.values)
    pd.testing.assert_frame_equal(again.capacity, clean.capacity)


def test_an_empty_philly_reading_is_still_a_masked_minute(tmp_path):
    p = io.load(str(_philly(tmp_path, "2017-10-03 00:02:00,,420")))
    assert np.isnan(p.values["philly/nodes"].iloc[2]) and p.capacity.iloc[2, 0] == 420


def _helios(tmp_path: Path, bad: str | None = None, n: int = 240) -> Path:
    folder = tmp_path / "helios-earth"
    for vc in ("vcA", "vcB"):
        times = pd.date_range("2020-05-01", periods=n, freq="min")
        rows = [f"{t:%Y-%m-%d %H:%M:%S},64,{10 + i % 5},0" for i, t in enumerate(times)]
        if bad is not None and vc == "vcB":
            rows[1] = bad
        (folder / vc).mkdir(parents=True)
        (folder / vc / "cluster_sequence_vc.csv").write_text(
            "\n".join([HELIOS_HEADER, *rows]) + "\n"
        )
    return folder


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("9999-05-01 00:00:00,64,14,0", "time '9999-05-01 00:00:00' in row 2 is outside the years"),
        ("2020-05-01 00:01:00,64,inf,0", "running_gpu_num 'inf' in row 2 is infinite"),
        (
            "2020-05-01 00:01:00,1e15,14,0",
            "total_gpu_num '1000000000000000.0' in row 2 is above 1,000,000,000",
        ),
        (
            "2020-05-01 00:01:00,64,65,0",
            "running_gpu_num '65' in row 2 is above its total_gpu_num 64",
        ),
        ("2020-05-01 00:01:00,64", "row 2 has 2 of the header's 4 fields"),
    ],
)
def test_a_bad_helios_row_is_one_line_naming_it(tmp_path, bad, says):
    """In a folder the line names the VC file at fault, not only the folder."""
    folder = _helios(tmp_path, bad)
    vc = folder / "vcB" / "cluster_sequence_vc.csv"
    assert says in _one_line_error(folder, named=vc)
    assert says in _one_line_error(vc)  # the file as the INPUT: named once


def test_a_bad_helios_vc_file_is_named_by_the_cli(tmp_path, capsys):
    """`forecast hel5` said `hel5: total_gpu_num 'abc' in row 199 is not a number`."""
    folder = _helios(tmp_path, "2020-05-01 00:01:00,abc,14,0")
    (folder / "vcA" / "cluster_sequence_vc.csv").write_text("")
    for command in ("forecast", "backtest"):
        assert main([command, str(folder)]) == 2
        assert capsys.readouterr().err == (
            f"gpu-defrag {command}: error: {folder}/vcA/cluster_sequence_vc.csv: "
            "No columns to parse from file\n"
        )
    (folder / "vcA" / "cluster_sequence_vc.csv").unlink()
    assert main(["forecast", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"gpu-defrag forecast: error: {folder}/vcB/cluster_sequence_vc.csv: "
        "total_gpu_num 'abc' in row 2 is not a number\n"
    )


def _pods(tmp_path: Path, deletion: str = "7200", scheduled: str = "60", **fields) -> Path:
    rows = [f"p{i},1,1000,0,{3600 + 60 * i},{60 * i}" for i in range(8)]
    num_gpu, gpu_milli = fields.get("num_gpu", "1"), fields.get("gpu_milli", "1000")
    rows[4] = f"p4,{num_gpu},{gpu_milli},0,{deletion},{scheduled}"
    path = tmp_path / "openb_pod_list_x.csv"
    path.write_text("\n".join([PODS_HEADER, *rows]) + "\n")
    return path


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"deletion": ""}, "deletion_time 'nan' in row 5 is empty for a scheduled pod"),
        ({"deletion": "inf"}, "deletion_time 'inf' in row 5 is infinite"),
        ({"deletion": "-1e9"}, "deletion_time '-1000000000.0' in row 5 is negative"),
        ({"deletion": "1e15"}, "deletion_time '1000000000000000.0' in row 5 is above 120,000,000"),
        ({"deletion": "30"}, "deletion_time '30' in row 5 is before the pod's scheduled_time 60"),
        ({"scheduled": "-5"}, "scheduled_time '-5' in row 5 is negative"),
        ({"gpu_milli": "2000"}, "gpu_milli '2000' in row 5 is above 1,000: more than a whole GPU"),
        ({"num_gpu": ""}, "num_gpu 'nan' in row 5 is empty"),
        ({"num_gpu": "-1"}, "num_gpu '-1' in row 5 is negative"),
    ],
)
def test_a_bad_pod_is_one_line_naming_it(tmp_path, fields, says):
    """An empty, infinite, negative or 1e15 deletion_time raised IndexError or asked for 121 TiB."""
    assert says in _one_line_error(_pods(tmp_path, **fields))


def test_a_pod_never_scheduled_needs_no_deletion_time(tmp_path):
    p = io.load(str(_pods(tmp_path, deletion="", scheduled="")))
    assert p.values["alibaba/gpus"].max() == 7  # p4 never held its GPU


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ("2024-01-01T05:00:00Z,a,1e300,8", "value '1e+300' in row 6 is above 1,000,000,000"),
        ("2024-01-01T05:00:00Z,a", "row 6 has 2 of the header's 4 fields (cut short?)"),
        ("2263-01-01T00:00:00Z,a,1,8", "time '2263-01-01T00:00:00Z' in row 6 is outside the years"),
        ("1600-01-01T00:00:00Z,a,1,8", "time '1600-01-01T00:00:00Z' in row 6 is outside the years"),
    ],
)
def test_the_long_format_bounds_values_dates_and_row_length(tmp_path, row, says):
    """1e300 gave "Input X contains NaN" after 73–147 lines; a short row read as masked."""
    times = pd.date_range("2024-01-01", periods=48, freq="h")
    rows = [f"{t:%Y-%m-%dT%H:%M:%SZ},a,{h + 1},8" for h, t in enumerate(times)]
    rows[5] = row
    path = tmp_path / "d.csv"
    path.write_text("\n".join(["time,series,value,capacity", *rows]) + "\n")
    assert says in _one_line_error(path)


def test_a_first_row_with_more_fields_than_the_header_names_it(tmp_path):
    """pandas took the extra leading fields of a first row for an index and every column
    shifted: `time '1' in row 1 is not an ISO 8601 time`."""
    path = tmp_path / "d.csv"
    path.write_text("time,series,value\n2024-01-01T00:00:00Z,a,1,2,3\n")
    assert "row 1 has 5 fields, more than the header's 3 (a stray comma?)" in (
        _one_line_error(path)
    )


def test_a_yearly_demand_history_past_2262_is_one_line_for_the_planner(tmp_path):
    """`plan --goal forecast=6h --demand` with yearly rows 2024…2263: OverflowError in _buckets."""
    from advisor.planner.cli import demand_from_history

    years = range(2024, 2264)
    path = tmp_path / "yearly.csv"
    path.write_text("time,series,value\n" + "".join(f"{y}-01-01,8,{y % 3}.0\n" for y in years))
    with pytest.raises(ValueError) as error:
        demand_from_history(str(path), 6 * 3600)
    assert "time '2201-01-01' in row 178 is outside the years 1970–2200" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("name", "rows", "says"),
    [
        (
            "blank.csv",
            "2024-01-01 00:00:00,8,1\n2024-01-01 00:00:00,,1\n2024-01-01 01:00:00,8,2\n",
            "series in row 2 is blank",
        ),
        ("nope.parquet", None, "[Errno 2] No such file or directory: '{path}'"),
        ("nope.pq", None, "[Errno 2] No such file or directory: '{path}'"),
    ],
)
def test_a_bad_demand_history_is_one_line_for_the_planner(tmp_path, capsys, name, rows, says):
    """`plan --demand` with a blank series said `bad shape 'nan'` (or planned a series 8.0);
    a missing Parquet file said only its path."""
    path = tmp_path / name
    if rows is not None:
        path.write_text("time,series,value\n" + rows)
    seed = ROOT / "examples" / "seed-16x8-a100.json"
    assert main(["plan", str(seed), "--goal", "forecast=6h", "--demand", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"gpu-defrag plan: error: {path}: cannot read demand history: {says.format(path=path)}\n"
    )


def test_a_power_down_replay_the_input_cannot_give_is_a_skip_note(tmp_path, capsys):
    """`--replays power` on GPUs of two series ran nothing and said nothing, while the idle and
    reservation replays say why they skip."""
    path = _long_csv(tmp_path)
    out = tmp_path / "out"
    argv = ["backtest", str(path), "--horizons", "1", "--quantiles", "0.5"]
    assert main([*argv, "--replays", "power", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == (
        "power-down replay skipped: needs one series of nodes in use (Philly), "
        "got 2 series of an unknown unit"
    )
    assert pd.read_csv(out / "metrics.csv")["model"].eq("advisor").any()
    assert (out / "decisions.csv").read_text().strip() == ""  # no replay ran


def test_a_horizon_the_test_part_cannot_score_is_one_line(tmp_path, capsys):
    """h = 168 on the default last 7 days of 21: KeyError 'series' in rolling.advisor_rows."""
    path = _long_csv(tmp_path)
    out = tmp_path / "out"
    assert (
        main(["backtest", str(path), "--horizons", "168", "--replays", "", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "h = 168: no test origin from" in err
    assert err.startswith(f"gpu-defrag backtest: error: {path}: h = 168")  # names the INPUT
    assert "the longest horizon this test part can score: 167 h" in err
    assert not out.exists()
    panel = io.hourly(io.load(str(path)), str(path))
    with pytest.raises(InputError, match=r"^h = 24, 168: no test origin"):
        rolling.run(panel, (1, 24, 168), test_from="2024-01-21 00:00")


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
def test_an_out_that_is_the_input_is_refused_and_the_input_kept(tmp_path, capsys, how):
    """`forecast in.csv --out in.csv` exited 0 and replaced the trace by its forecast."""
    path = _long_csv(tmp_path, days=10)
    before = path.read_bytes()
    out = tmp_path / "out.csv"
    if how == "symlink":
        out.symlink_to(path.name)
    elif how == "hardlink":
        os.link(path, out)
    else:
        out = path
    assert main(["forecast", str(path), "--horizons", "1", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"gpu-defrag forecast: error: --out {out}: is the INPUT {path}; the results would overwrite it\n"
    )
    assert path.read_bytes() == before


def test_a_backtest_out_that_is_the_helios_input_is_refused(tmp_path, capsys):
    folder = _helios(tmp_path)
    assert main(["backtest", str(folder), "--out", str(folder)]) == 2
    vc = folder / "vcA" / "cluster_sequence_vc.csv"
    before = vc.read_bytes()
    assert main(["forecast", str(folder), "--out", str(vc)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(f"--out {folder}: is the INPUT {folder}; the results would overwrite it")
    assert err[1].endswith(f"is {vc}, which the INPUT reads; the results would overwrite it")
    assert vc.read_bytes() == before


RESULTS = {
    "decisions.csv",
    "forecast.png",
    "forecasts.csv",
    "metrics.csv",
    "metrics_full.csv",
    "picks.csv",
    "significance.csv",
    "interval_significance.csv",
    "summary.csv",
}


def _backtest(tmp_path: Path, out: Path, stdout) -> subprocess.Popen:
    """`gpu-defrag backtest` as its own process with unbuffered output, as a terminal or an
    ssh session gives it: every print reaches stdout at once."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "advisor.cli", "backtest", str(_long_csv(tmp_path))]
    command += ["--horizons", "1", "--replays", "idle", "--out", str(out)]
    return subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE, cwd=ROOT, env=env)


def test_the_results_reach_out_before_a_closed_pipe_stops_the_printout(tmp_path):
    """`backtest … --out w | head -1` exited 0 and wrote nothing: every table was printed first."""
    out = tmp_path / "out"
    run = _backtest(tmp_path, out, subprocess.PIPE)
    run.stdout.close()  # the reader is gone before the first line
    run.stderr.read()
    run.wait(timeout=120)
    assert {p.name for p in out.iterdir()} >= RESULTS
    assert pd.read_csv(out / "metrics.csv")["model"].eq("advisor").any()


def test_the_results_reach_out_when_stdout_is_a_full_disk(tmp_path):
    out = tmp_path / "out"
    with open("/dev/full", "w") as full:
        run = _backtest(tmp_path, out, full)
        run.stderr.read()
        run.wait(timeout=120)
    assert {p.name for p in out.iterdir()} >= RESULTS


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--replays", "idle,powr", "unknown replay 'powr'; choose from idle,power,reservation"),
        ("--quantiles", "0.5,0.50000000001", "are both column q0.5"),
    ],
)
def test_a_replay_typo_or_two_quantiles_in_one_column_are_refused(
    tmp_path, capsys, flag, value, message
):
    """'powr' ran no replay and said nothing; 0.5 and 0.50000000001 became one q0.5 column."""
    argv = ["backtest", str(_long_csv(tmp_path)), flag, value, "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_replays_flag_takes_none_or_known_names() -> None:
    from advisor.cli import build_parser

    def replays(value: str):
        return build_parser().parse_args(["backtest", "x.csv", "--replays", value]).replays

    assert replays("") == frozenset()
    assert replays(" idle , power") == {"idle", "power"}
    assert build_parser().parse_args(["backtest", "x.csv"]).replays == {
        "idle",
        "power",
        "reservation",
    }


def test_data_too_short_for_the_test_part_names_the_input_and_the_window(tmp_path, capsys):
    """Three hours of one day: the default test part (the last 7 whole days) holds none of them.
    The line named the window as '[None, None)' and not the INPUT."""
    path = tmp_path / "short.csv"
    path.write_text(
        "time,series,value\n" + "".join(f"2026-01-05T{h}:00:00Z,a,{h}\n" for h in (10, 11, 12))
    )
    out = tmp_path / "out"
    assert main(["backtest", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"gpu-defrag backtest: error: {path}: no hour of the data (2026-01-05 10:00:00 … "
        "2026-01-05 12:00:00) lies in the test part [2025-12-29 00:00:00, 2026-01-05 00:00:00) "
        "(--test-from sets it)\n"
    )
    assert not out.exists()
