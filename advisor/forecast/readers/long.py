"""The long format (CSV or Parquet), one row per observation::

    time,series,value[,capacity]
    2024-05-01T00:00:00Z,cluster-a/A100,41,64

`series` is read as text exactly as written (`007` stays `007`; a blank one is an error, see
`_names`); `value` empty or NaN marks a masked point; `capacity` is the known pool size at that
time (forecasts are clipped to it and models see it as a covariate, including its future schedule).
Any other row that cannot be read (a bad time or one outside the years 1970–2200, a value that
is not a count from 0 to `MAX_AMOUNT`, a repeated (time, series), a row with fewer fields than the
header) is an error naming the first such row. A file pandas cannot split into the header's
fields, or that is not UTF-8 text, is one line saying which line, and, without the format's
header, that it is in none of the formats read.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from advisor.forecast.panel import Panel, freq_step
from advisor.forecast.readers.checks import (
    check_span,
    check_whole_rows,
    parse_amounts,
    parse_times,
    refuse,
    row_name,
)
from gpu_defrag_common.messages import one_line, unknown_key


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
            return f"series in {row_name(i)}"
        return f"series {str(raw.iloc[i])!r} in {row_name(i)}"

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
    raise ValueError(f"{row_name(at)} repeats {row_name(first)}: series {name!r} at {time}{more}")


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
    df["time"] = parse_times(df["time"])
    df["series"] = _names(df["series"])
    df["value"] = parse_amounts(df["value"], "value")
    if "capacity" in df.columns:
        df["capacity"] = parse_amounts(df["capacity"], "capacity")
    _no_repeats(df)
    step = freq_step(freq) if freq is not None else typical_step(df)
    if len(df):
        df["bucket"] = _buckets(df["time"], step)
        check_span(df["bucket"], step)
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
            check_whole_rows(path)
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
    problem = _not_text(path) if isinstance(error, UnicodeDecodeError) else unparsable(error)
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


def unparsable(error: pd.errors.ParserError) -> str:
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
