"""The advisor's own history as forecast panels: its runs at their own times, by the hour.

The history (`advisor.history.History.pool_demand()`) holds allocated GPUs per pool at every
run. Its runs, at their own times, form a Panel that `Panel.resample("h")` (the one hourly
aggregation, as in the backtest) turns into hourly means plus each hour's readings
(`Panel.within`: last reading, min, max, slope); complete hours only, so the result changes
once an hour. An hour with fewer than half the runs expected from the spacing of the runs up
to it is masked (`covered`). `node_panel` does the same for the history's per-node hours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from advisor.forecast.panel import Panel

if TYPE_CHECKING:
    from advisor.history import NodeHours

MIN_COVERAGE = 0.5  # an hour with fewer of its expected runs is masked (as Panel.resample)
SPACING_RUNS = 11  # trailing runs whose median gap sets the spacing (`covered`)


@dataclass(frozen=True)
class RunsPanel(Panel):
    """The service's runs at their own times (one row per run, one column per pool); complete
    hours only. Its `resample` masks a bucket by the service's coverage rule (`covered`: the
    runs expected from the spacing of the runs up to it) instead of `Panel.resample`'s one
    spacing for the whole input, which would mask the hourly backfill once the live runs
    dominate. Consumers that aggregate the panel they are given by `resample` (the demand
    forecast's `hourly_panel`, `idle_windows` and `idle.backtest` through `hourly_idle` and
    `minute_state`) therefore all see the same observed and masked hours."""

    def resample(self, freq: str, how: str = "mean", min_coverage: float = MIN_COVERAGE) -> Panel:
        every = Panel.resample(self, freq, how, min_coverage=0.0)  # every bucket with a run
        keep = covered(self.values, every.index, freq, min_coverage)
        return Panel(
            every.values.where(keep),
            every.capacity,
            every.name,
            every.test_from,
            every.test_to,
            dict(every.meta),
            {k: v.where(keep) for k, v in every.within.items()},
        )

    def select(self, series: list[str]) -> RunsPanel:
        return RunsPanel(self.values[series], self.capacity[series], self.name)

    def since(self, start: pd.Timestamp) -> RunsPanel:
        """The runs from `start` on (bounds the history an expensive consumer sees)."""
        keep = self.index >= start
        return RunsPanel(self.values[keep], self.capacity[keep], self.name)


def runs_panel(pool_demand: pd.DataFrame, column: str = "allocated_gpus") -> RunsPanel | None:
    """A pool column of the history (`column`: allocated GPUs for demand, held GPUs for idle
    windows; mean of a run's rows) and capacity (max) per pool at each run's own time, the hour
    still running left out. None when there is no complete hour yet."""
    if pool_demand.empty:
        return None
    time = pd.to_datetime(pool_demand["time"], utc=True).dt.tz_localize(None)
    frame = pool_demand.assign(time=time)
    frame = frame[frame["time"] < time.max().floor("h")]  # the hour still running
    if frame.empty:
        return None
    runs_by_pool = (
        frame.groupby(["time", "pool"])
        .agg(value=(column, "mean"), capacity=("capacity_gpus", "max"))
        .unstack("pool")
    )
    values, capacity = runs_by_pool["value"], runs_by_pool["capacity"]
    values.columns.name = capacity.columns.name = values.index.name = capacity.index.name = None
    return RunsPanel(values.astype(float), capacity.astype(float), "advisor")


def hourly_panel(pool_demand: pd.DataFrame) -> Panel | None:
    """Hourly mean allocated GPUs, the readings inside each hour (`within`) and max capacity per
    pool, by `Panel.resample("h")` of the runs at their own times; the hour still running is
    left out. None when there is no complete hour yet.

    The runs are irregular (an interval plus run time, jitter, a backfill one hour apart before
    the live runs, gaps while the source is down), so `resample`'s own rule, which takes one
    spacing for the whole input, would mask every backfilled hour once the live runs dominate.
    Here an hour is masked when it holds fewer than half the runs expected from the spacing of
    the runs up to it (`RunsPanel`, `covered`); hours without a run stay masked; capacity (the
    hour's max) is carried over them.
    """
    return hourly_of(runs_panel(pool_demand))


def hourly_of(runs: RunsPanel | None) -> Panel | None:
    """`hourly_panel` from an already built runs panel."""
    if runs is None:
        return None
    hourly = runs.resample("h")
    return Panel(hourly.values, hourly.capacity.ffill(), "advisor", within=hourly.within)


def covered(
    values: pd.DataFrame,
    hours: pd.DatetimeIndex,
    freq: str = "h",
    min_coverage: float = MIN_COVERAGE,
) -> pd.DataFrame:
    """Per bucket (hour) and pool: True when it holds at least `min_coverage` of the runs
    expected.

    A run's spacing is the median gap between the last `SPACING_RUNS` runs up to it (earlier
    runs only, so an hour's mask never depends on a later hour); an hour expects one hour ÷ the
    median spacing of its runs. A normal hour of runs is kept whatever the interval, a slower
    stretch or a restart; a source outage of more than half an hour masks the hour, and so does
    a lone run inside a long outage (its trailing window still sees the usual spacing).
    """
    seconds = ((values.index - values.index[0]) / pd.Timedelta(seconds=1)).to_numpy(float)
    gaps = pd.Series(np.diff(seconds, prepend=np.nan), index=values.index)
    spacing = gaps.rolling(SPACING_RUNS, min_periods=1).median()
    bucket_s = pd.Timedelta(pd.tseries.frequencies.to_offset(freq)) / pd.Timedelta(seconds=1)
    step = spacing.groupby(values.index.floor(freq)).median().reindex(hours)
    expected = (bucket_s / step).fillna(1.0)
    counts = values.notna().resample(freq).sum().reindex(hours, fill_value=0)
    need = np.maximum(1.0, min_coverage * expected.to_numpy())
    return counts.ge(need, axis=0)


def node_panel(record: NodeHours | None) -> Panel | None:
    """Hourly panel of the history's per-node record (`History.node_hours()`): one column per node,
    values = the hour's peak held GPUs (`NodeRows`), capacity = its largest usable GPUs; complete
    hours only (the latest run's hour is left out), on a full hourly grid (hours without a run are
    NaN). A node's hour is masked (NaN value) when the hour is thin for the whole fleet, by the
    service's coverage rule on the hour's run times (`covered`, as the pools' `RunsPanel`: a
    backfilled hour of one run is observed), or when fewer than `MIN_COVERAGE` of the hour's runs
    saw the node; its capacity stays wherever a run saw it (as for pools). Nodes no complete hour
    saw are left out. `meta["pools"]`: each node's pool. None: no complete hour."""
    if record is None or len(record.hours) < 2:
        return None
    done = len(record.hours) - 1  # the last hour is the latest run's: still running
    seen_any = record.seen[:done].sum(axis=0) > 0
    if not seen_any.any():
        return None
    hours = record.hours[:done]
    grid = np.arange(hours[0], hours[-1] + 1)
    index = pd.DatetimeIndex(pd.to_datetime(grid * 3600, unit="s"))
    run_times = record.run_times[: int(record.runs[:done].sum())]
    runs_at = pd.DatetimeIndex(pd.to_datetime(run_times, unit="s"))
    fleet = covered(pd.DataFrame({"runs": 1.0}, index=runs_at), index)["runs"].to_numpy()
    rows = (hours - grid[0]).astype(int)
    columns = np.flatnonzero(seen_any)
    seen = np.zeros((len(grid), len(columns)), dtype=np.int64)
    held = np.full(seen.shape, np.nan)
    capacity = np.full(seen.shape, np.nan)
    seen[rows] = record.seen[:done][:, columns]
    held[rows] = np.round(record.peak_held[:done][:, columns].astype(float), 3)
    capacity[rows] = record.capacity[:done][:, columns]
    runs = np.zeros(len(grid), dtype=np.int64)
    runs[rows] = record.runs[:done]
    kept = fleet[:, None] & (seen > 0) & (seen >= MIN_COVERAGE * runs[:, None])
    names = [record.names[j] for j in columns.tolist()]
    return Panel(
        pd.DataFrame(np.where(kept, held, np.nan), index=index, columns=names),
        pd.DataFrame(np.where(seen > 0, capacity, np.nan), index=index, columns=names),
        "advisor-nodes",
        meta={"pools": {record.names[j]: record.pools[j] for j in columns.tolist()}},
    )
