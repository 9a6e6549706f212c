"""Readers: long format, Philly, Helios; gaps and outages are masked, never filled."""

import numpy as np
import pandas as pd
import pytest

from advisor.forecast import io
from advisor.forecast.errors import InputError
from advisor.forecast.panel import WITHIN, Panel
from advisor.forecast.readers import checks
from advisor.forecast.readers.checks import mask_zero_runs
from advisor.forecast.readers.long import from_long
from advisor.forecast.readers.openb import read_openb_pods
from tests.ci import skip_or_fail


def test_long_format_reader_masks_missing_rows_and_empty_values(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text(
        "time,series,value,capacity\n"
        "2024-01-01T00:00:00Z,a,1,8\n"
        "2024-01-01T01:00:00Z,a,,8\n"
        "2024-01-01T03:00:00Z,a,4,16\n"
        "2024-01-01T00:00:00Z,b,2,4\n"
        "2024-01-01T03:00:00Z,b,3,4\n"
    )
    p = io.load(str(path))
    assert p.series == ["a", "b"]
    assert len(p.index) == 4  # 02:00 is missing everywhere and still gets a (masked) row
    assert np.isnan(p.values["a"].iloc[1]) and np.isnan(p.values["a"].iloc[2])
    assert p.values["a"].iloc[3] == 4
    assert p.capacity["a"].tolist() == [8, 8, 8, 16]


def test_long_format_needs_its_columns():
    with pytest.raises(ValueError):
        from_long(pd.DataFrame({"time": [], "value": []}))


def test_parquet_long_format(tmp_path):
    frame = pd.DataFrame(
        {
            "time": pd.date_range("2024-01-01", periods=3, freq="h"),
            "series": "x",
            "value": [1, 2, 3],
        }
    )
    path = tmp_path / "d.parquet"
    try:
        frame.to_parquet(path)
    except ImportError:
        skip_or_fail("no parquet engine (pip install pyarrow)")
    assert io.load(str(path)).values["x"].tolist() == [1, 2, 3]


def test_philly_reader_masks_outage_and_gap(tmp_path):
    times = pd.date_range("2017-10-25 22:00", periods=240, freq="min")
    active = np.full(240, 300)
    active[60:150] = 0  # a 90-minute logging outage
    active[170:180] = 0  # a 10-minute dropout: also a logging fault, not idle demand
    frame = pd.DataFrame({"time": times, "active": active, "total": 420})
    frame = frame.drop(index=range(200, 220))  # a 20-minute gap
    path = tmp_path / "philly_node_sequence.csv"
    frame.to_csv(path, index=False)
    p = io.load(str(path))
    v = p.values["philly/nodes"]
    assert v.iloc[60:150].isna().all()
    assert v.iloc[200:220].isna().all()
    assert v.iloc[170:180].isna().all()
    assert (v.iloc[:60] == 300).all()
    hourly = p.resample("h")
    # the outage hours (23:00 fully, 00:00 mostly) are masked, not averaged in as zeros
    assert hourly.values["philly/nodes"].isna().sum() >= 1
    assert np.nanmin(hourly.values["philly/nodes"]) == 300
    assert np.nanmin(hourly.within["last"]["philly/nodes"]) == 300  # no hour ends on a dropout


def test_short_zero_runs_are_kept():
    s = pd.Series([5.0, 0, 0, 5, 0, 0, 0, 0, 5])
    out = mask_zero_runs(s, min_points=4)
    assert out.iloc[1] == 0 and np.isnan(out.iloc[5])


def test_helios_reader_builds_vcs_and_a_coherent_total(tmp_path):
    cols = "time,running_gpu_num,total_gpu_num\n"
    for vc, used in (("vcA", 3), ("vcB", 5)):
        d = tmp_path / "helios-earth" / vc
        d.mkdir(parents=True)
        rows = [
            f"2020-05-01 00:{m:02d}:00,{used},16" for m in range(10) if not (vc == "vcB" and m == 4)
        ]
        (d / "cluster_sequence_vc.csv").write_text(cols + "\n".join(rows) + "\n")
    p = io.load(str(tmp_path / "helios-earth"))
    assert set(p.series) == {"earth/vcA", "earth/vcB", "earth/total"}
    assert p.values["earth/total"].iloc[0] == 8
    assert np.isnan(p.values["earth/total"].iloc[4])  # masked where a member is masked
    assert p.capacity["earth/total"].iloc[0] == 32


def test_openb_pod_list_becomes_allocated_gpus_per_minute(tmp_path):
    path = tmp_path / "openb_pod_list_x.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "a,1000,1,1,500,,LS,Running,0,600,0\n"  # half a GPU for 10 minutes
        "b,1000,1,2,1000,,LS,Running,120,300,120\n"  # two GPUs from minute 2 to 5
        "c,1000,1,8,1000,,LS,Pending,60,600,\n"  # never scheduled: holds nothing
    )
    p = read_openb_pods(path, start_day=0)
    v = p.values["alibaba/gpus"].to_numpy()
    np.testing.assert_allclose(v[:10], [0.5, 0.5, 2.5, 2.5, 2.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    assert io.load(str(path)).series == ["alibaba/gpus"]


def _minute_panel(values: dict[str, list[float]], start="2024-01-01") -> Panel:
    n = len(next(iter(values.values())))
    idx = pd.date_range(start, periods=n, freq="min")
    vals = pd.DataFrame(values, index=idx, dtype=float)
    return Panel(vals, pd.DataFrame(100.0, index=idx, columns=vals.columns))


def test_resample_carries_the_last_reading_min_max_and_slope_of_each_hour():
    ramp = list(np.arange(180.0))  # one per minute: the mean of hour k is 60k + 29.5
    ramp[119] = np.nan  # the last minute of hour 1 is missing: its last reading is minute 118
    flat = [5.0] * 100 + [np.nan] * 80  # hour 2 holds no reading: masked
    h = _minute_panel({"a": ramp, "b": flat}).resample("h")
    assert set(h.within) == set(WITHIN)
    for k in WITHIN:
        pd.testing.assert_index_equal(h.within[k].index, h.values.index)
    assert h.within["last"]["a"].tolist() == [59, 118, 179]
    assert h.within["min"]["a"].tolist() == [0, 60, 120]
    assert h.within["max"]["a"].tolist() == [59, 118, 179]
    np.testing.assert_allclose(h.within["slope"]["a"], 60.0)  # +1 per minute = +60 per hour
    assert h.within["last"]["b"].iloc[1] == 5 and h.within["slope"]["b"].iloc[1] == 0
    # a masked hour stays masked in every sub-hour field
    assert np.isnan(h.values["b"].iloc[2])
    assert all(np.isnan(h.within[k]["b"].iloc[2]) for k in WITHIN)
    # selecting series keeps the sub-hour fields
    assert h.select(["b"]).within["last"].columns.tolist() == ["b"]


def test_resample_never_takes_a_reading_from_after_the_hour():
    base = _minute_panel({"a": list(np.arange(180.0))})
    later = base.values.copy()
    later.iloc[60:] = -1.0  # every minute after hour 0 changes
    h1, h2 = base.resample("h"), Panel(later, base.capacity).resample("h")
    for k in WITHIN:
        assert h1.within[k]["a"].iloc[0] == h2.within[k]["a"].iloc[0]
    assert h1.within["last"]["a"].iloc[1] != h2.within["last"]["a"].iloc[1]


def test_on_an_hourly_input_the_sub_hour_fields_equal_the_hourly_value(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text(
        "time,series,value\n"
        "2024-01-01T00:00:00Z,a,1\n"
        "2024-01-01T01:00:00Z,a,\n"
        "2024-01-01T02:00:00Z,a,4\n"
    )
    h = io.load(str(path)).resample("h")
    for k in ("last", "min", "max"):
        pd.testing.assert_series_equal(h.within[k]["a"], h.values["a"], check_names=False)
    assert h.within["slope"]["a"].iloc[0] == 0 and np.isnan(h.within["slope"]["a"].iloc[1])
    # a panel that was not resampled knows nothing inside its steps
    assert io.load(str(path)).within == {}


def _write_long(tmp_path, rows: list[str], header: str = "time,series,value,capacity") -> str:
    path = tmp_path / "d.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return str(path)


def _hourly_rows(n: int = 6, series: str = "a") -> list[str]:
    times = pd.date_range("2024-01-01", periods=n, freq="h").strftime("%Y-%m-%dT%H:%M:%SZ")
    return [f"{t},{series},{h + 1},8" for h, t in enumerate(times)]


@pytest.mark.parametrize(
    ("row", "words"),
    [
        (
            "2024-01-01T09:00:00Z,a,abc,8",
            "value 'abc' in row 4 is not a number; 2 bad values in all",
        ),
        ("2024-01-01T09:00:00Z,a,-3,8", "value '-3' in row 4 is negative; 2 bad values in all"),
        ("2024-01-01T09:00:00Z,a,inf,8", "value 'inf' in row 4 is infinite; 2 bad values in all"),
        (
            "2024-01-01T09:00:00Z,a,1,lots",
            "capacity 'lots' in row 4 is not a number; 2 bad capacities in all",
        ),
        ("2024-13-45,a,1,8", "time '2024-13-45' in row 4 is not an ISO 8601 time; 2 bad times"),
        ("2024-01-01T01:00:00Z,a,5,8", "row 4 repeats row 2: series 'a' at 2024-01-01 01:00:00; 2"),
    ],
)
def test_a_bad_long_row_is_one_line_naming_it(tmp_path, row, words):
    """Non-numbers, negatives and inf used to become NaN or 0 and repeated rows were averaged,
    silently; a bad time was a multi-line pandas message cut at "You might want to try:"."""
    rows = _hourly_rows(3)
    bad = row.replace("09:", "10:").replace("01:00:00Z,a,5", "02:00:00Z,a,5")
    path = _write_long(tmp_path, [*rows, row, *_hourly_rows(3, "b"), bad])
    with pytest.raises(InputError) as error:
        io.load(path)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and words in message, message
    assert "\n" not in message and "You might want" not in message


def test_empty_and_nan_values_stay_masked_points(tmp_path):
    path = _write_long(
        tmp_path, [*_hourly_rows(3), "2024-01-01T03:00:00Z,a, ,8", "2024-01-01T04:00:00Z,a,NaN,"]
    )
    values = io.load(path).values["a"]
    assert values.iloc[:3].tolist() == [1, 2, 3] and values.iloc[3:].isna().all()


def test_the_grid_step_is_the_typical_spacing_not_the_smallest(tmp_path):
    """A row a second late, and a second series a second behind the first: the step stays an hour
    and each row counts toward the hour it falls in (it was a 1-s grid, every hour masked)."""
    rows = _hourly_rows(48)
    rows[5] = "2024-01-01T05:00:01Z,a,6,8"
    late = [r.replace(":00:00Z,a", ":00:01Z,b") for r in _hourly_rows(48)]
    p = io.load(_write_long(tmp_path, rows + late))
    assert p.index.freq == pd.Timedelta(hours=1) and len(p.index) == 48
    assert p.values["a"].tolist() == list(range(1, 49)) == p.values["b"].tolist()
    assert np.isfinite(p.resample("h").values.to_numpy()).all()


def test_a_mistyped_far_date_is_refused_before_the_grid_is_built(tmp_path, monkeypatch):
    """A row dated 2200 in an hourly 2024 file made a 1.5-million-step grid (66 s, 2.4 GB) and
    an origin in 2200; a span past MAX_STEPS is refused too."""
    rows = _hourly_rows(48)
    rows[7] = "2200-01-01T00:00:00Z,a,1,8"
    with pytest.raises(
        InputError,
        match=r"2200-01-01 00:00:00: 1,542,\d{3} steps of 1 h, 48 .* between row 48 "
        r"\(2024-01-02 23:00:00\) and row 8 \(2200-01-01 00:00:00\)\); is a date mistyped\?$",
    ):
        io.load(_write_long(tmp_path, rows))
    monkeypatch.setattr(checks, "MAX_STEPS", 24)
    with pytest.raises(InputError, match=r"48 steps of 1 h, 48 of them .* mistyped\?$"):
        io.load(_write_long(tmp_path, _hourly_rows(48)))


@pytest.mark.parametrize(
    ("name", "header"),
    [
        ("philly_node_sequence.csv", "time,active,total"),
        ("d.csv", "time,series,value"),
        (
            "openb_pod_list_x.csv",
            "name,num_gpu,gpu_milli,creation_time,deletion_time,scheduled_time",
        ),
        ("helios-earth/vcA/cluster_sequence_vc.csv", "time,running_gpu_num,total_gpu_num"),
    ],
)
def test_a_header_only_file_is_one_line(tmp_path, name, header):
    """The Philly and Helios readers raised AttributeError on an empty file (not one line)."""
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n")
    with pytest.raises(InputError) as error:
        io.load(str(path))
    assert str(error.value).startswith(f"{path}: ") and "\n" not in str(error.value)


def test_a_bad_philly_time_names_its_row(tmp_path):
    path = tmp_path / "philly_node_sequence.csv"
    path.write_text("time,active,total\n2017-10-03 00:00:00,3,420\nabc,4,420\n")
    with pytest.raises(InputError, match=r"time 'abc' in row 2 is not an ISO 8601 time$"):
        io.load(str(path))


def test_a_reader_error_of_several_lines_is_one_line_keeping_all_of_it(monkeypatch):
    """Parsers (pandas, pyarrow) write their context on later lines: folded, not cut off."""

    def broken(source, freq):
        raise ValueError("Error tokenizing data.\n  C error: Expected 3 fields in line 7, saw 4")

    monkeypatch.setattr(io, "_open", broken)
    with pytest.raises(InputError, match="Expected 3 fields") as raised:
        io.load("trace.csv")
    assert "\n" not in str(raised.value)
    assert str(raised.value).startswith("trace.csv: Error tokenizing data. C error")


NOT_LONG = "not a CSV of the long format (time,series,value[,capacity]), Philly, Helios or openb"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        # /etc/passwd: one field in the header (no comma), four where a GECOS field has commas
        (
            b"root:x:0:0:root:/root:/bin/bash\nbin:x:1:1:bin:/bin:/sbin/nologin\n"
            b"pg:x:101:104:PostgreSQL administrator,,,:/var/lib/postgresql:/bin/bash\n",
            f"{NOT_LONG}: line 3 has 4 fields where the header has 1",
        ),
        (b'a,b\n1,2\n"x,3\n', f"{NOT_LONG}: row 2 opens a quote that is never closed"),
        (b"\x7fELF\x02\x01\x01\x00\xd0\x00", f"{NOT_LONG}: line 1 is not UTF-8 text (byte 0xd0)"),
        # the long format's header: what is wrong, and where, without the list of formats
        (b'time,series,value\n2024-01-01,a,1\n"2024-01-01,b,3\n', "row 2 opens a quote"),
        (b"time,series,value\n2024-01-01,a,1\n2024-01-01,b,\xff\n", "line 3 is not UTF-8 text"),
    ],
)
def test_a_file_in_no_known_format_says_what_was_expected(tmp_path, content, says):
    """pandas' `Error tokenizing data. C error: Expected 1 fields in line 24, saw 4` (and a
    codec error for a binary) was the whole message: the line says what the reader expected."""
    path = tmp_path / "passwd"
    path.write_bytes(content)
    with pytest.raises(InputError) as raised:
        io.load(str(path))
    assert str(raised.value).startswith(f"{path}: {says}")
    assert "\n" not in str(raised.value) and "tokenizing" not in str(raised.value)
    assert (NOT_LONG in str(raised.value)) == says.startswith(NOT_LONG)


def test_a_philly_row_of_too_many_fields_names_its_line(tmp_path):
    path = tmp_path / "philly_node_sequence.csv"
    path.write_text("time,active,total\n2017-10-03 00:00:00,3,420\n2017-10-03 00:01:00,3,420,5\n")
    with pytest.raises(InputError) as raised:
        io.load(str(path))
    assert str(raised.value) == f"{path}: line 3 has 4 fields where the header has 3"


def _two_series(first: str, second: str, hours: int = 3) -> list[str]:
    times = pd.date_range("2024-01-01", periods=hours, freq="h").strftime("%Y-%m-%d %H:%M:%S")
    return [f"{t},{name},{h}" for h, t in enumerate(times) for name in (first, second)]


@pytest.mark.parametrize(
    ("first", "second"), [("007", "08"), ("1e3", "2"), ("NA", "null"), ("None", "nan")]
)
def test_long_csv_series_names_stay_as_written(tmp_path, first, second):
    """pandas read `007` as 7, `1e3` as 1000.0, and `NA`/`null` as missing: a series `nan`."""
    path = _write_long(tmp_path, _two_series(first, second), header="time,series,value")
    p = io.load(path)
    assert sorted(p.series) == sorted([first, second])
    assert p.values[first].tolist() == [0, 1, 2] == p.values[second].tolist()


def test_a_blank_long_series_is_one_line_naming_its_row(tmp_path):
    """One blank series cell turned `1`, `8` into `1.0`, `8.0` and forecast a series `nan`; two
    blank cells at one time raised IndexError in `_no_repeats`."""
    rows = _two_series("8", "1")
    rows[2] = rows[2].replace(",8,", ",,")
    path = _write_long(tmp_path, rows, header="time,series,value")
    with pytest.raises(InputError) as error:
        io.load(path)
    assert str(error.value) == f"{path}: series in row 3 is blank"
    both = ["2024-01-01 00:00:00,,1", "2024-01-01 00:00:00, ,2", *_two_series("a", "b")[2:]]
    path = _write_long(tmp_path, both, header="time,series,value")
    with pytest.raises(InputError) as error:
        io.load(path)
    assert str(error.value) == f"{path}: series in row 1 is blank; 2 bad series in all"


def test_empty_and_na_values_and_capacities_stay_masked_beside_text_series(tmp_path):
    """Only the series column is read as text: an empty, `NA` or `null` value or capacity is
    still a masked or unknown point."""
    rows = _hourly_rows(4, series="NA")
    rows[1] = "2024-01-01T01:00:00Z,NA,NA,null"
    rows[2] = "2024-01-01T02:00:00Z,NA,,"
    p = io.load(_write_long(tmp_path, rows))
    assert p.series == ["NA"]
    assert np.isnan(p.values["NA"].iloc[1:3]).all() and p.values["NA"].iloc[3] == 4


def _parquet(tmp_path, series, name: str = "d.parquet"):
    frame = pd.DataFrame(
        {"time": pd.date_range("2024-01-01", periods=3, freq="h"), "series": series, "value": 1}
    )
    path = tmp_path / name
    try:
        frame.to_parquet(path)
    except ImportError:
        skip_or_fail("no parquet engine (pip install pyarrow)")
    return path


def test_parquet_series_of_whole_numbers_become_their_text_and_others_are_refused(tmp_path):
    """A Parquet series column of whole numbers reads as the CSV writes them (`8`); a float
    column (8.0, or whole numbers with a null) is refused: which name would 8.0 be?"""
    assert io.load(str(_parquet(tmp_path, [8, 8, 8]))).series == ["8"]
    nullable = pd.array([8, None, 8], dtype="Int64")
    path = _parquet(tmp_path, nullable)
    with pytest.raises(InputError) as error:
        io.load(str(path))
    assert str(error.value) == f"{path}: series in row 2 is blank"
    path = _parquet(tmp_path, [8.0, 8.0, 8.0])
    with pytest.raises(InputError) as error:
        io.load(str(path))
    assert str(error.value) == (
        f"{path}: series '8.0' in row 1 is a float64, not text or a whole number: store the "
        "series names as text; 3 bad series in all"
    )


@pytest.mark.parametrize("name", ["nope.parquet", "nope.pq", "nope.csv"])
def test_a_missing_long_file_says_no_such_file(tmp_path, name):
    """A missing Parquet file said only its path twice (`nope.parquet: nope.parquet`)."""
    path = tmp_path / name
    with pytest.raises(InputError) as error:
        io.load(str(path))
    assert str(error.value) == f"{path}: [Errno 2] No such file or directory: '{path}'"
