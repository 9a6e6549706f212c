"""Readers that turn demand histories into one shape: a wide `Panel` of values and capacity.

Every input (the generic long CSV/Parquet format, the Philly node sequence, the Helios Earth VC
files, the advisor's own Prometheus history) ends up as a regular time grid with one column per
series. Masked points (gaps, logging outages) are NaN: models skip them and metrics ignore them,
so an outage is never learned as demand.

Long format (CSV or Parquet), one row per observation::

    time,series,value[,capacity]
    2024-05-01T00:00:00Z,cluster-a/A100,41,64

`series` is read as text exactly as written (`007` stays `007`; a blank one is an error, see
`_names`); `value` empty or NaN marks a masked point; `capacity` is the known pool size at that
time (forecasts are clipped to it and models see it as a covariate, including its future schedule).
Any other row that cannot be read (a bad time or one outside the years 1970–2200, a value that
is not a count from 0 to `MAX_AMOUNT`, a repeated (time, series), a row with fewer fields than the
header) is an error naming the first such row: it is never masked or averaged silently. A file
pandas cannot split into the header's fields, or that is not UTF-8 text, is one line saying which
line, and, without the format's header, that it is in none of the formats read. The Philly,
Helios and openb readers make the same checks on their own columns (`_per_minute`,
`read_openb_pods`).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from gpu_defrag_common.messages import one_line, unknown_key

PHILLY_TEST = ("2017-12-01", "2017-12-15")
EARTH_TEST = ("2020-05-25", "2020-06-01")


@dataclass(frozen=True)
class Panel:
    """Aligned wide frames on a regular grid: `values` (NaN = masked) and `capacity` (NaN = unknown)."""

    values: pd.DataFrame
    capacity: pd.DataFrame
    name: str = "data"
    test_from: pd.Timestamp | None = None
    test_to: pd.Timestamp | None = None
    meta: dict = field(default_factory=dict)
    # Sub-step information per grid step, filled by `resample` from the finer input grid: `WITHIN`
    # names → frames aligned with `values`, NaN wherever `values` is masked. Empty: none known.
    within: dict = field(default_factory=dict)

    @property
    def series(self) -> list[str]:
        return [str(c) for c in self.values.columns]

    @property
    def index(self) -> pd.DatetimeIndex:
        return self.values.index  # type: ignore[return-value]

    def resample(self, freq: str, how: str = "mean", min_coverage: float = 0.5) -> Panel:
        """Aggregate to `freq`; a bucket with less than `min_coverage` of its points is masked.

        Also fills `within` from the points inside each bucket (see `within_stats`): the last
        reading, min, max and least-squares slope per hour, masked where the bucket is.
        """
        vals, cap = self.values, self.capacity
        grouped = vals.resample(freq)
        agg = getattr(grouped, how)()
        counts = vals.notna().resample(freq).sum()
        expected = _points_per_bucket(vals.index, freq)
        keep = counts >= max(1.0, min_coverage * expected)
        agg = agg.where(keep)
        capr = cap.resample(freq).max().reindex(agg.index)
        within = {k: v.where(keep) for k, v in within_stats(vals, freq).items()}
        return Panel(agg, capr, self.name, self.test_from, self.test_to, dict(self.meta), within)

    def select(self, series: list[str]) -> Panel:
        return Panel(
            self.values[series],
            self.capacity[series],
            self.name,
            self.test_from,
            self.test_to,
            dict(self.meta),
            {k: v[series] for k, v in self.within.items()},
        )


WITHIN = ("last", "min", "max", "slope")


def within_stats(vals: pd.DataFrame, freq: str) -> dict[str, pd.DataFrame]:
    """Per bucket of `freq` (labelled by its start, as `resample`), from its observed points only:
    `last` (the latest reading in the bucket: never one from a later bucket), `min`, `max` and
    `slope` (least-squares trend in value per hour; 0 with fewer than two points).

    On a grid no finer than `freq` each bucket holds one point: last = min = max = the value.
    """
    grouped = vals.resample(freq)
    last = grouped.last()
    labels = vals.index.floor(freq)
    obs = vals.notna().to_numpy()
    # hours since the bucket start, for the observed points only
    x = np.where(obs, ((vals.index - labels) / pd.Timedelta(hours=1)).to_numpy(float)[:, None], 0)
    yv = np.where(obs, vals.to_numpy(float), 0.0)
    n, sx, sy, sxx, sxy = (
        _bucket_sums(a, labels, vals.columns, last.index)
        for a in (obs.astype(float), x, yv, x * x, x * yv)
    )
    nz = n.where(n > 0)
    var = sxx - sx * sx / nz
    slope = ((sxy - sx * sy / nz) / var.where(var > 1e-9)).fillna(0.0)
    return {"last": last, "min": grouped.min(), "max": grouped.max(), "slope": slope.where(n > 0)}


def _bucket_sums(a: np.ndarray, labels: pd.DatetimeIndex, columns, index) -> pd.DataFrame:
    """Column sums of `a` over each run of equal `labels` (rows sorted by time), on `index`.

    Each bucket's sum is computed from its own rows only, so later rows cannot change it even
    in the last bit (a grouped sum's rounding may depend on the rest of the frame).
    """
    if not len(a):
        return pd.DataFrame(0.0, index=index, columns=columns)
    starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
    sums = pd.DataFrame(np.add.reduceat(a, starts, axis=0), index=labels[starts], columns=columns)
    return sums.reindex(index, fill_value=0.0)


def _step(freq: str | pd.Timedelta) -> pd.Timedelta:
    """A frequency ("h", "min", a Timedelta) as one grid step."""
    return pd.Timedelta(pd.tseries.frequencies.to_offset(freq))


def _grid_step(index: pd.DatetimeIndex) -> pd.Timedelta:
    """The spacing of a regular grid (the median, so a masked stretch does not count)."""
    return pd.Series(index).diff().median() if len(index) > 1 else pd.Timedelta(hours=1)


def _points_per_bucket(index: pd.DatetimeIndex, freq: str) -> float:
    if len(index) < 2:
        return 1.0
    return max(1.0, _step(freq) / _grid_step(index))


def _regular(frame: pd.DataFrame, freq: str) -> pd.DataFrame:
    """Reindex onto a full regular grid so missing timestamps become NaN (gaps are masked).

    A frame without rows stays empty, so a header-only file reads as "no readings".
    """
    frame = frame.sort_index()
    frame = frame[~frame.index.duplicated(keep="last")]
    if frame.empty:
        return frame
    full = pd.date_range(frame.index.min(), frame.index.max(), freq=freq)
    return frame.reindex(full)


def mask_zero_runs(values: pd.Series, min_points: int) -> pd.Series:
    """Mask runs of exact zeros at least `min_points` long: a logging outage, not idle demand.

    Used where a true zero is implausible (Philly always runs jobs on hundreds of nodes).
    """
    zero = values.eq(0)
    run_id = (zero != zero.shift()).cumsum()
    run_len = zero.groupby(run_id).transform("sum")
    return values.mask(zero & (run_len >= min_points))


MAX_STEPS = 2_000_000  # grid steps per series a long input may span (228 years of hours)
SPARSE_SHARE = 0.01  # a long grid (> SPARSE_STEPS) with fewer rows than this share: a mistyped date
SPARSE_STEPS = 10_000
# The most GPUs or nodes one reading may count: a thousand times the largest fleets (~10⁶ GPUs), so
# no real reading reaches it, while a typo (1e15, 1e308) is refused before a model squares it.
MAX_AMOUNT = 1e9
ABOVE_FLEETS = "more GPUs or nodes than any fleet holds"  # why no reading exceeds it
# Times must lie in the years 1970–2200: nothing real lies outside, and every grid, origin and
# target (up to a year's step ahead) then stays inside pandas' nanosecond clock (1677–2262).
FIRST_TIME, END_TIME = pd.Timestamp("1970-01-01"), pd.Timestamp("2201-01-01")
OUTSIDE_YEARS = f"outside the years {FIRST_TIME.year}–{END_TIME.year - 1} (a mistyped year?)"


def _row(position: int) -> str:
    """Rows are counted from 1 after the header (line n + 1 of a CSV)."""
    return f"row {position + 1}"


PLURAL = {"capacity": "capacities", "series": "series"}  # where not the name + "s"


def refuse(
    bad: pd.Series, what: str, named: Callable[[int], str], why: Callable[[int], str]
) -> None:
    """One line naming the first bad `what` (`named(i)`: where it is and its value), why it is
    bad and how many are; nothing if none. The one shape of every reader's error line."""
    count = int(bad.sum())
    if not count:
        return
    first = int(np.flatnonzero(bad.to_numpy())[0])
    more = "" if count == 1 else f"; {count} bad {PLURAL.get(what, what + 's')} in all"
    raise ValueError(f"{named(first)} is {why(first)}{more}")


def _refuse(bad: pd.Series, raw: pd.Series, what: str, why: Callable[[int], str]) -> None:
    """`refuse` naming the first bad row of a file and its text."""
    refuse(bad, what, lambda i: f"{what} {str(raw.iloc[i])!r} in {_row(i)}", why)


def _names(raw: pd.Series) -> pd.Series:
    """Series names as text, exactly as written: a CSV's `series` column is read as text (see
    `_read_long_csv`), so `007`, `1e3` and `NA` stay those names. A whole number (a Parquet or
    frame column of integers) becomes its decimal text, as a CSV writes it (`8`). A blank name
    (empty, spaces only, or a missing value) and any other kind of value (a float such as 8.0,
    a bool: which name would it be?) name their row."""
    if isinstance(raw.dtype, pd.StringDtype) or pd.api.types.is_integer_dtype(raw.dtype):
        text = raw.astype(str).where(raw.notna())
        other = pd.Series(False, index=raw.index)
    else:
        values = raw.astype(object)
        text = values.map(_name_text)
        other = text.isna() & values.notna()
    blank = text.isna() & ~other
    blank |= text.fillna("x").astype(str).str.strip().eq("")

    def named(i: int) -> str:
        if blank.iloc[i]:
            return f"series in {_row(i)}"
        return f"series {str(raw.iloc[i])!r} in {_row(i)}"

    def why(i: int) -> str:
        if blank.iloc[i]:
            return "blank"
        kind = type(raw.iloc[i]).__name__
        return f"a {kind}, not text or a whole number: store the series names as text"

    refuse(blank | other, "series", named, why)
    return text.astype(str)


def _name_text(value: object) -> str | None:
    """A name's text: a string as it is, a whole number in decimal; None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
        return str(value)
    return None


def _times(raw: pd.Series) -> pd.Series:
    """ISO 8601 times as naive UTC; an empty or unparseable time, or one outside the years
    `FIRST_TIME` … `END_TIME`, names its row."""
    times = pd.to_datetime(raw, utc=True, errors="coerce", format="ISO8601")
    _refuse(times.isna(), raw, "time", lambda _i: "not an ISO 8601 time")
    times = times.dt.tz_localize(None)
    _in_years(times, raw)
    return times


def _in_years(times: pd.Series, raw: pd.Series) -> None:
    """A time before `FIRST_TIME` or from `END_TIME` on names its row: a mistyped year (1600,
    9999) would otherwise build a grid of centuries or overflow pandas' nanosecond clock."""
    bad = (times < FIRST_TIME) | (times >= END_TIME)
    _refuse(bad, raw, "time", lambda _i: OUTSIDE_YEARS)


def _amounts(
    raw: pd.Series,
    what: str,
    most: float = MAX_AMOUNT,
    above: str = ABOVE_FLEETS,
    blank: bool = True,
) -> pd.Series:
    """Counts of GPUs or nodes: finite, from 0 to `most` (`above` says why no more). Empty (or
    NaN) is a masked point where `blank`, an error otherwise; anything else that is not such a
    number names its row, since silently masking it would hide a broken file."""
    numbers, bad, why = bad_amounts(raw, most, above, blank)
    _refuse(bad, raw, what, why)
    return numbers.astype(float)


def bad_amounts(
    raw: pd.Series,
    most: float = MAX_AMOUNT,
    above: str = ABOVE_FLEETS,
    blank: bool = True,
) -> tuple[pd.Series, pd.Series, Callable[[int], str]]:
    """`_amounts`' check without the refusal, for a reader that names a bad reading otherwise
    than by its row (the Prometheus input: by series and time): the numbers, which of them are
    bad, and why the one at position i is ("negative", "infinite", "above 1,000,000,000: …")."""
    numbers = pd.to_numeric(raw, errors="coerce")
    unread = numbers.isna() & raw.notna()
    unread[unread] = raw[unread].astype(str).str.strip().ne("")  # blank: masked
    bad = unread | np.isinf(numbers) | (numbers < 0) | (numbers > most)
    if not blank:
        bad |= numbers.isna()

    def why(i: int) -> str:
        x = numbers.iloc[i]
        if np.isnan(x):
            return "not a number" if unread.iloc[i] else "empty"
        if np.isinf(x):
            return "infinite"
        return "negative" if x < 0 else f"above {most:,.0f}: {above}"

    return numbers, bad, why


def _whole_rows(path: str | Path) -> None:
    """A row with fewer fields than the header (a line cut short, a lost comma) names its row:
    `read_csv` would fill the missing fields with NaN, masking or dropping them silently. So
    does a row with more (a stray comma): where the first row has them, `read_csv` takes the
    extra leading fields for an index and every column shifts. Blank lines are skipped, as
    `read_csv` skips them, so row n is the frame's row n."""
    with open(path, newline="", encoding="utf-8") as stream:
        rows = csv.reader(stream)
        width = len(next(rows, []))
        first, count, position = None, 0, 0
        longer: tuple[int, int] | None = None
        for fields in rows:
            if not fields:
                continue
            position += 1
            if len(fields) < width:
                count += 1
                if first is None:
                    first = (position, len(fields))
            elif len(fields) > width and longer is None:
                longer = (position, len(fields))
    if first is not None:
        more = "" if count == 1 else f"; {count} short rows in all"
        raise ValueError(
            f"row {first[0]} has {first[1]} of the header's {width} fields (cut short?){more}"
        )
    if longer is not None:
        raise ValueError(
            f"row {longer[0]} has {longer[1]} fields, more than the header's {width} "
            "(a stray comma?)"
        )


def _no_repeats(df: pd.DataFrame) -> None:
    """Two rows for one (time, series) are an error: averaging them would hide a broken export."""
    repeated = df.duplicated(["time", "series"])
    if not repeated.any():
        return
    at = int(np.flatnonzero(repeated.to_numpy())[0])
    time, name = df["time"].iloc[at], df["series"].iloc[at]
    first = int(np.flatnonzero(((df["time"] == time) & (df["series"] == name)).to_numpy())[0])
    count = int(repeated.sum())
    more = "" if count == 1 else f"; {count} repeated rows in all"
    raise ValueError(f"{_row(at)} repeats {_row(first)}: series {name!r} at {time}{more}")


def _lower_median(ns: pd.Series) -> int:
    return int(np.sort(ns.to_numpy())[(len(ns) - 1) // 2])


def typical_step(df: pd.DataFrame) -> pd.Timedelta:
    """The grid step of a long frame: the typical spacing of each series' rows (lower median of
    its positive gaps), then of the series (lower median), in whole seconds.

    Not the smallest gap: one row a second off the grid would make the step a second. The lower
    median keeps the step at 1 h for a series with as many missing hours as present ones.
    """
    ordered = df.sort_values(["series", "time"])
    gaps = ordered.groupby("series")["time"].diff()
    gaps = gaps[gaps > pd.Timedelta(0)]
    if gaps.empty:
        return pd.Timedelta(hours=1)
    ns = gaps.astype("timedelta64[ns]").astype("int64")
    per_series = ns.groupby(ordered.loc[gaps.index, "series"]).agg(_lower_median)
    step = pd.Timedelta(_lower_median(per_series))
    return step.round("s") if step >= pd.Timedelta(seconds=1) else step


def _buckets(times: pd.Series, step: pd.Timedelta) -> pd.Series:
    """The grid step each time falls in, counted from midnight of the first day (as `resample`)."""
    origin = times.min().normalize()
    return (origin + (times - origin) // step * step).dt.as_unit(times.dt.unit)


def _check_span(buckets: pd.Series, step: pd.Timedelta) -> None:
    """Refuse a grid that a mistyped date would blow up: more than `MAX_STEPS` steps, or a long
    grid that its rows barely touch (a row dated 2200 in an hourly 2024 file)."""
    first, last = buckets.min(), buckets.max()
    steps = int((last - first) // step) + 1
    held = buckets.nunique()
    if steps <= MAX_STEPS and (steps <= SPARSE_STEPS or held >= SPARSE_SHARE * steps):
        return
    ordered = buckets.drop_duplicates().sort_values()  # labelled by the first row in each step
    gap = ordered.diff().fillna(pd.Timedelta(0))
    at = int(gap.to_numpy().argmax())
    before, after = (f"{_row(int(ordered.index[i]))} ({ordered.iloc[i]})" for i in (at - 1, at))
    raise ValueError(
        f"the times span {first} … {last}: {steps:,} steps of {_text(step)}, {held:,} of them "
        f"with a row (the largest gap, {gap.iloc[at] / pd.Timedelta(days=1):,.1f} days, lies "
        f"between {before} and {after}); is a date mistyped?"
    )


def _text(step: pd.Timedelta) -> str:
    """A step in its largest whole unit (1 h, 5 min, 30 s)."""
    seconds = step.total_seconds()
    for unit, name in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if seconds >= unit and seconds % unit == 0:
            return f"{int(seconds // unit)} {name}"
    return str(step)


def _on_grid(df: pd.DataFrame, column: str, step: pd.Timedelta, how: str) -> pd.DataFrame:
    """Wide frame (time × series) of `column`, one row per grid step, every step present."""
    wide = df.pivot_table(
        index="bucket", columns="series", values=column, aggfunc=how, dropna=False
    )
    if wide.empty:
        return wide
    grid = pd.date_range(wide.index.min(), wide.index.max(), freq=step)
    return wide.reindex(grid.as_unit(wide.index.unit))


def from_long(
    frame: pd.DataFrame, name: str = "long", freq: str | pd.Timedelta | None = None
) -> Panel:
    """Build a Panel from a long frame with columns time, series, value[, capacity].

    Checks every row (times, values, capacities, repeated (time, series)) and names the first
    bad one; rows off the grid (`freq`, default `typical_step`) count toward the step they fall in.
    """
    missing = {"time", "series", "value"} - set(frame.columns)
    if missing:
        raise ValueError(
            f"long format needs columns time, series, value; missing {sorted(missing)}"
        )
    df = frame.reset_index(drop=True)
    df["time"] = _times(df["time"])
    df["series"] = _names(df["series"])
    df["value"] = _amounts(df["value"], "value")
    if "capacity" in df.columns:
        df["capacity"] = _amounts(df["capacity"], "capacity")
    _no_repeats(df)
    step = _step(freq) if freq is not None else typical_step(df)
    if len(df):
        df["bucket"] = _buckets(df["time"], step)
        _check_span(df["bucket"], step)
    else:
        df["bucket"] = df["time"]
    values = _on_grid(df, "value", step, "mean")
    if "capacity" in df.columns:
        cap = _on_grid(df, "capacity", step, "max")
        cap = cap.reindex(values.index).reindex(columns=values.columns).ffill()
    else:
        cap = pd.DataFrame(np.nan, index=values.index, columns=values.columns)
    values.columns.name = cap.columns.name = None
    return Panel(values.astype(float), cap.astype(float), name)


def _dated(raw: pd.DataFrame) -> pd.DataFrame:
    """A time column `read_csv` could not parse stays text: parse it here, so a bad time is one
    line naming its row (a parsed column keeps its values; one with an offset becomes naive UTC,
    as `_times` reads it). Either way a time outside `FIRST_TIME` … `END_TIME` names its row."""
    if not pd.api.types.is_datetime64_any_dtype(raw["time"]):
        raw["time"] = _times(raw["time"])
        return raw
    if raw["time"].dt.tz is not None:
        raw["time"] = raw["time"].dt.tz_convert(None)
    _in_years(raw["time"], raw["time"])
    return raw


def _per_minute(path: str | Path, raw: pd.DataFrame, used: str, size: str) -> pd.DataFrame:
    """The long format's checks for a per-minute file (Philly's `active` of `total` nodes, a
    Helios VC's `running_gpu_num` of `total_gpu_num`), each naming its first bad row: whole rows,
    times (ISO 8601, years 1970–2200), counts (finite, 0 to `MAX_AMOUNT`; empty is masked), no
    more in use than the pool holds, no two different readings for one minute (an exact copy of
    a row is harmless and dropped), and a span that `_check_span` accepts (one row dated 1600 in
    a 2017 file made a grid of 200 million minutes). Returns the rows indexed by time."""
    _whole_rows(path)
    raw = _dated(raw.reset_index(drop=True))
    text = {col: raw[col] for col in (used, size)}
    for col in (used, size):
        raw[col] = _amounts(raw[col], col)
    over = raw[used] > raw[size]
    _refuse(over, text[used], used, lambda i: f"above its {size} {text[size].iloc[i]!s}")
    _one_reading_per_time(raw, [used, size])
    if len(raw):
        _check_span(raw["time"], pd.Timedelta(minutes=1))
    return raw.set_index("time")


def _one_reading_per_time(raw: pd.DataFrame, columns: list[str]) -> None:
    """Two rows for one time with different readings are an error naming the first repeat
    (keeping either would be a guess); rows that repeat one another exactly are harmless."""
    repeated = raw.duplicated("time")
    if not repeated.any():
        return
    distinct = raw.drop_duplicates(["time", *columns])
    clashing = distinct["time"][distinct.duplicated("time")]
    bad = repeated & raw["time"].isin(clashing)
    if not bad.any():
        return
    at = int(np.flatnonzero(bad.to_numpy())[0])
    time = raw["time"].iloc[at]
    first = int(np.flatnonzero((raw["time"] == time).to_numpy())[0])
    count = int(bad.sum())
    more = "" if count == 1 else f"; {count} such rows in all"
    raise ValueError(
        f"{_row(at)} repeats the time {time} of {_row(first)} with another reading{more}"
    )


def read_long(path: str | Path, freq: str | None = None) -> Panel:
    """Read the documented long CSV/Parquet format."""
    path = Path(path)
    if path.suffix in {".parquet", ".pq"}:
        # opened here, so a missing or unreadable file says why ("No such file or directory")
        # as the CSV reader does: pyarrow's FileNotFoundError held only the path
        with open(path, "rb") as stream:
            frame = pd.read_parquet(stream)
    else:
        try:
            frame = _read_long_csv(path)
            _whole_rows(path)
        except (pd.errors.ParserError, UnicodeDecodeError) as error:
            raise ValueError(_not_long(path, error)) from None
    known = (*LONG_COLUMNS, "capacity")
    columns = [str(column) for column in frame.columns]
    for column in columns if set(LONG_COLUMNS) <= set(columns) else ():
        # a misspelt `capacity` would be dropped without a word (one missing: from_long says)
        if column not in known:
            raise ValueError(
                f"{column}: {unknown_key(str(column), known, 'the long format', 'column')}"
            )
    return from_long(frame, name=path.stem, freq=freq)


LONG_COLUMNS = ("time", "series", "value")


def _not_long(path: Path, error: pd.errors.ParserError | UnicodeDecodeError) -> str:
    """Why a file the long reader was left with cannot be read, in its words, not pandas':
    a file of another shape (/etc/passwd, a binary) is `not a CSV of the long format (...),
    Philly, Helios or openb: line 24 has 4 fields where the header has 1`; a long CSV with the
    format's header says only what is wrong at which line."""
    problem = _not_text(path) if isinstance(error, UnicodeDecodeError) else _unparsable(error)
    try:
        header = {str(column) for column in pd.read_csv(path, nrows=0).columns}
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        header = set()
    if set(LONG_COLUMNS) <= header:
        return problem
    return (
        "not a CSV of the long format (time,series,value[,capacity]), Philly, Helios or "
        f"openb: {problem}"
    )


def _not_text(path: Path) -> str:
    """`line 3 is not UTF-8 text (byte 0xff)`: the first line that does not decode (pandas'
    error counts from the chunk it decoded, not from the file's start)."""
    with open(path, "rb") as stream:
        for number, raw in enumerate(stream, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as error:
                return f"line {number} is not UTF-8 text (byte {raw[error.start]:#04x})"
    return "not UTF-8 text"  # pragma: no cover - pandas found a byte that does not decode


_TOO_MANY_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")
_OPEN_QUOTE = re.compile(r"EOF inside string starting at row (\d+)")


def _unparsable(error: pd.errors.ParserError) -> str:
    """pandas' tokenizer error in the reader's words: `line 24 has 4 fields where the header has
    1` for its `Expected 1 fields in line 24, saw 4`, `row 2 opens a quote that is never closed`
    for `EOF inside string starting at row 2`; any other, on one line as it is."""
    text = str(error)
    if found := _TOO_MANY_FIELDS.search(text):
        width, line, seen = found.groups()
        return f"line {line} has {seen} fields where the header has {width}"
    if found := _OPEN_QUOTE.search(text):
        return f"row {found[1]} opens a quote that is never closed"
    return one_line(error)


try:  # the strings `read_csv` reads as missing by default (NA, null, NaN, empty, …)
    from pandas._libs.parsers import STR_NA_VALUES as PANDAS_NA
except ImportError:  # pragma: no cover - the same list, as pandas documents it
    PANDAS_NA = {
        *("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND"),
        *("1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"),
    }


def _read_long_csv(path: Path) -> pd.DataFrame:
    """A long CSV with its `series` column as text exactly as written: pandas' inference made
    `007` the series 7, `1e3` 1000.0, `NA` and `null` missing (a series called nan) and, with
    one blank cell, `8` 8.0. Every other column keeps `read_csv`'s defaults (an empty, `NaN` or
    `NA` value or capacity is a masked point)."""
    header = pd.read_csv(path, nrows=0).columns
    missing = {str(column): list(PANDAS_NA) for column in header if column != "series"}
    return pd.read_csv(path, dtype={"series": str}, keep_default_na=False, na_values=missing)


def read_philly(path: str | Path) -> Panel:
    """Philly `time, active, total` per minute: nodes with ≥ 1 job; masks gaps and logging faults.

    Philly never runs on zero nodes, so every exact zero is masked: the Oct-26 outage (18 hours)
    and the 10- and 40-minute dropouts on Dec 3 and Dec 6.
    """
    raw = _per_minute(path, pd.read_csv(path, parse_dates=["time"]), "active", "total")
    raw = _regular(raw, "min")
    active = mask_zero_runs(raw["active"].astype(float), min_points=1)
    values = pd.DataFrame({"philly/nodes": active})
    cap = pd.DataFrame({"philly/nodes": raw["total"].astype(float).ffill()})
    return Panel(
        values,
        cap,
        "philly",
        pd.Timestamp(PHILLY_TEST[0]),
        pd.Timestamp(PHILLY_TEST[1]),
        {"unit": "nodes"},
    )


def read_helios_vc(path: str | Path, name: str | None = None) -> tuple[pd.Series, pd.Series]:
    """One Helios `cluster_sequence_vc.csv`: running GPUs and the VC size per minute."""
    path = Path(path)
    raw = pd.read_csv(
        path, usecols=["time", "running_gpu_num", "total_gpu_num"], parse_dates=["time"]
    )
    raw = _regular(_per_minute(path, raw, "running_gpu_num", "total_gpu_num"), "min")
    vc = name or path.parent.name
    return raw["running_gpu_num"].rename(vc).astype(float), raw["total_gpu_num"].rename(vc).astype(
        float
    ).ffill()


def helios_files(path: str | Path) -> list[Path]:
    """The VC files a Helios INPUT reads: the file itself, or a folder's
    `<vc>/cluster_sequence_vc.csv` files."""
    path = Path(path)
    return [path] if path.is_file() else sorted(path.glob("*/cluster_sequence_vc.csv"))


def read_helios(path: str | Path, total: bool = True) -> Panel:
    """A Helios directory of `<vc>/cluster_sequence_vc.csv` (or one such file); adds `<cluster>/total`."""
    path = Path(path)
    files = helios_files(path)
    if not files:
        raise FileNotFoundError(f"no */cluster_sequence_vc.csv under {path}")
    cluster = (path.parent.parent if path.is_file() else path).name.replace("helios-", "")
    vals, caps = {}, {}
    for f in files:
        try:
            v, c = read_helios_vc(f)
        except (OSError, ValueError, KeyError) as error:
            if path.is_file():
                raise  # the INPUT is the file: `load` names it
            # a folder's error names the VC file at fault, not only the folder
            raise InputError(f"{f}: {one_line(error)}") from error
        vals[f"{cluster}/{v.name}"] = v
        caps[f"{cluster}/{v.name}"] = c
    values = pd.DataFrame(vals)
    cap = pd.DataFrame(caps)
    if total and len(files) > 1:
        # The total is masked wherever any VC is masked so the levels stay coherent.
        values[f"{cluster}/total"] = values.sum(axis=1, min_count=len(files)).where(
            values.notna().all(axis=1)
        )
        cap[f"{cluster}/total"] = cap.sum(axis=1, min_count=1)
    first = values.index.min()
    test_from, test_to = None, None
    if len(values.index) and first.year == 2020 and first.month == 5:
        test_from, test_to = pd.Timestamp(EARTH_TEST[0]), pd.Timestamp(EARTH_TEST[1])
    return Panel(values, cap, cluster, test_from, test_to, {"unit": "GPUs"})


OPENB_EPOCH = pd.Timestamp("2023-01-01")  # the trace's times are seconds from an unnamed start


def read_openb_pods(path: str | Path, start_day: float = 116) -> Panel:
    """Alibaba cluster-trace-gpu-v2023 pod list → allocated GPUs per minute (`alibaba/gpus`).

    A scheduled pod holds num_gpu × gpu_milli/1000 GPUs from scheduled_time to deletion_time;
    never-scheduled pods hold nothing. Before `start_day` almost no pods exist (the note's days
    116–149 are the usable ~800 hours). The calendar is synthetic (seconds from the trace start
    placed at 2023-01-01), so day-of-week features carry no meaning here.
    """
    pods = _pods(path)
    pods = pods[pods["scheduled_time"].notna()]
    if pods.empty:
        raise ValueError("no scheduled pod in the list")
    gpus = pods["num_gpu"].to_numpy(float) * pods["gpu_milli"].to_numpy(float) / 1000.0
    start = (pods["scheduled_time"].to_numpy(float) // 60).astype(int)
    end = (pods["deletion_time"].to_numpy(float) // 60).astype(int)
    n = int(end.max()) + 2
    delta = np.zeros(n)
    np.add.at(delta, start, gpus)
    np.add.at(delta, end, -gpus)
    alloc = np.cumsum(delta)[:-1]
    index = OPENB_EPOCH + pd.to_timedelta(np.arange(len(alloc)), unit="min")
    values = pd.DataFrame({"alibaba/gpus": np.round(alloc, 6)}, index=index)
    later = values[values.index >= OPENB_EPOCH + pd.Timedelta(days=start_day)]
    values = later if len(later) else values  # a shorter pod list: keep all of it
    cap = pd.DataFrame(np.nan, index=values.index, columns=values.columns)
    return Panel(values, cap, "alibaba", meta={"unit": "GPUs"})


LAST_SECOND = MAX_STEPS * 60  # a pod list's grid is per minute from the trace start: 3.8 years


def _pods(path: str | Path) -> pd.DataFrame:
    """An openb pod list whose rows `read_openb_pods` can add up, or ValueError naming the first
    bad row: whole rows; num_gpu 0–64 and gpu_milli 0–1000, never empty; scheduled_time empty
    (never scheduled) or seconds from 0 to `LAST_SECOND`; a scheduled pod's deletion_time in
    that range too and not before its scheduled_time (an empty, infinite or 1e15 deletion_time
    raised IndexError or asked for 121 TiB)."""
    from advisor.ingest.openb import MAX_GPUS  # the replay's pod reader bounds num_gpu alike
    from advisor.model import MILLI

    pods = pd.read_csv(path).reset_index(drop=True)
    _whole_rows(path)
    _amounts(pods["num_gpu"], "num_gpu", MAX_GPUS, "more GPUs than one pod may ask for", False)
    _amounts(pods["gpu_milli"], "gpu_milli", MILLI, "more than a whole GPU", False)
    seconds = f"more than {MAX_STEPS:,} minutes after the trace start, the longest grid there is"
    start = _amounts(pods["scheduled_time"], "scheduled_time", LAST_SECOND, seconds)
    end = _amounts(pods["deletion_time"], "deletion_time", LAST_SECOND, seconds)
    held = start.notna()
    _refuse(
        held & end.isna(),
        pods["deletion_time"],
        "deletion_time",
        lambda _i: "empty for a scheduled pod",
    )
    _refuse(
        held & (end < start),
        pods["deletion_time"],
        "deletion_time",
        lambda i: f"before the pod's scheduled_time {pods['scheduled_time'].iloc[i]!s}",
    )
    return pods


class InputError(ValueError):
    """A forecast INPUT that cannot be read, said in one line that names the source."""


def load(source: str, freq: str | None = None) -> Panel:
    """Open any supported INPUT: a Philly CSV, a Helios dir/file, an openb pod list, long
    CSV/Parquet, or prometheus+http(s)://.

    Every way a source can be unreadable (missing file, wrong columns, unparsable values, an
    unreachable Prometheus, no data at all) becomes one `InputError` line naming the source
    (for a Helios folder, the VC file at fault), so the CLI can say what is wrong instead of
    printing a traceback.
    """
    from advisor.ingest.exporter_scrape import SourceUnavailable

    try:
        panel = _open(source, freq)
    except InputError:
        raise  # already names the file at fault (a Helios folder's VC file)
    except pd.errors.ParserError as error:  # a Philly or openb CSV pandas cannot split
        raise InputError(f"{source}: {_unparsable(error)}") from error
    except (OSError, ValueError, KeyError, SourceUnavailable) as error:
        raise InputError(f"{source}: {one_line(error)}") from error
    return _with_readings(panel, f"{source}: no readings")


def hourly(panel: Panel, source: str) -> Panel:
    """`panel` by the hour, as every forecast and backtest reads it. An input of which no hour
    holds enough readings is an `InputError`: its forecast would be all NaN."""
    return _with_readings(
        panel.resample("h"),
        f"{source}: no hour holds half the readings its grid step gives it "
        f"({_text(_grid_step(panel.index))}); an hour with fewer is masked",
    )


def _with_readings(panel: Panel, message: str) -> Panel:
    if panel.values.empty or not np.isfinite(panel.values.to_numpy(float)).any():
        raise InputError(message)
    return panel


def _open(source: str, freq: str | None) -> Panel:
    if source.startswith(("prometheus+http://", "prometheus+https://")):
        from advisor.forecast.promsource import read_prometheus

        return read_prometheus(source)
    path = Path(source)
    if path.is_dir():
        return read_helios(path)
    if path.name == "cluster_sequence_vc.csv":
        return read_helios(path)
    if path.suffix == ".csv":
        header = pd.read_csv(path, nrows=0).columns
        if {"active", "total"} <= set(header) and "series" not in header:
            return read_philly(path)
        if {"scheduled_time", "deletion_time", "num_gpu", "gpu_milli"} <= set(header):
            return read_openb_pods(path)
        if {"num_gpu", "gpu_milli"} <= set(header):
            raise ValueError(
                "an openb pod list without scheduled_time and deletion_time has no times to "
                "forecast (the replay's synthetic lists are such)"
            )
    return read_long(path, freq=freq)
