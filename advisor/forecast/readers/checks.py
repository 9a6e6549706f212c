"""The checks every reader makes on its rows, and the one shape of their error lines.

A value that cannot be read is never masked or averaged silently: a bad time or one outside the
years 1970–2200, a count that is not a number from 0 to `MAX_AMOUNT`, a row cut short or too long,
two readings for one minute, a grid a mistyped date would blow up: each is one line naming the
first such row (`refuse`).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd


def on_regular_grid(frame: pd.DataFrame, freq: str) -> pd.DataFrame:
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


def row_name(position: int) -> str:
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


def refuse_rows(bad: pd.Series, raw: pd.Series, what: str, why: Callable[[int], str]) -> None:
    """`refuse` naming the first bad row of a file and its text."""
    refuse(bad, what, lambda i: f"{what} {str(raw.iloc[i])!r} in {row_name(i)}", why)


def parse_times(raw: pd.Series) -> pd.Series:
    """ISO 8601 times as naive UTC; an empty or unparseable time, or one outside the years
    `FIRST_TIME` … `END_TIME`, names its row."""
    times = pd.to_datetime(raw, utc=True, errors="coerce", format="ISO8601")
    refuse_rows(times.isna(), raw, "time", lambda _i: "not an ISO 8601 time")
    times = times.dt.tz_localize(None)
    check_years(times, raw)
    return times


def check_years(times: pd.Series, raw: pd.Series) -> None:
    """A time before `FIRST_TIME` or from `END_TIME` on names its row: a mistyped year (1600,
    9999) would otherwise build a grid of centuries or overflow pandas' nanosecond clock."""
    bad = (times < FIRST_TIME) | (times >= END_TIME)
    refuse_rows(bad, raw, "time", lambda _i: OUTSIDE_YEARS)


def parse_amounts(
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
    refuse_rows(bad, raw, what, why)
    return numbers.astype(float)


def bad_amounts(
    raw: pd.Series,
    most: float = MAX_AMOUNT,
    above: str = ABOVE_FLEETS,
    blank: bool = True,
) -> tuple[pd.Series, pd.Series, Callable[[int], str]]:
    """`parse_amounts`' check without the refusal, for a reader that names a bad reading otherwise
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


def check_whole_rows(path: str | Path) -> None:
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


def check_span(buckets: pd.Series, step: pd.Timedelta) -> None:
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
    before, after = (f"{row_name(int(ordered.index[i]))} ({ordered.iloc[i]})" for i in (at - 1, at))
    raise ValueError(
        f"the times span {first} … {last}: {steps:,} steps of {step_text(step)}, {held:,} of them "
        f"with a row (the largest gap, {gap.iloc[at] / pd.Timedelta(days=1):,.1f} days, lies "
        f"between {before} and {after}); is a date mistyped?"
    )


def step_text(step: pd.Timedelta) -> str:
    """A step in its largest whole unit (1 h, 5 min, 30 s)."""
    seconds = step.total_seconds()
    for unit, name in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")):
        if seconds >= unit and seconds % unit == 0:
            return f"{int(seconds // unit)} {name}"
    return str(step)


def parse_dated(raw: pd.DataFrame) -> pd.DataFrame:
    """A time column `read_csv` could not parse stays text: parse it here, so a bad time is one
    line naming its row (a parsed column keeps its values; one with an offset becomes naive UTC,
    as `parse_times` reads it). Either way a time outside `FIRST_TIME` … `END_TIME` names its row."""
    if not pd.api.types.is_datetime64_any_dtype(raw["time"]):
        raw["time"] = parse_times(raw["time"])
        return raw
    if raw["time"].dt.tz is not None:
        raw["time"] = raw["time"].dt.tz_convert(None)
    check_years(raw["time"], raw["time"])
    return raw


def per_minute(path: str | Path, raw: pd.DataFrame, used: str, size: str) -> pd.DataFrame:
    """The long format's checks for a per-minute file (Philly's `active` of `total` nodes, a
    Helios VC's `running_gpu_num` of `total_gpu_num`), each naming its first bad row: whole rows,
    times (ISO 8601, years 1970–2200), counts (finite, 0 to `MAX_AMOUNT`; empty is masked), no
    more in use than the pool holds, no two different readings for one minute (an exact copy of
    a row is harmless and dropped), and a span that `check_span` accepts (one row dated 1600 in
    a 2017 file made a grid of 200 million minutes). Returns the rows indexed by time."""
    check_whole_rows(path)
    raw = parse_dated(raw.reset_index(drop=True))
    text = {col: raw[col] for col in (used, size)}
    for col in (used, size):
        raw[col] = parse_amounts(raw[col], col)
    over = raw[used] > raw[size]
    refuse_rows(over, text[used], used, lambda i: f"above its {size} {text[size].iloc[i]!s}")
    _one_reading_per_time(raw, [used, size])
    if len(raw):
        check_span(raw["time"], pd.Timedelta(minutes=1))
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
        f"{row_name(at)} repeats the time {time} of {row_name(first)} with another reading{more}"
    )
