"""The one shape every forecast input becomes: a `Panel` of values and capacity on a regular grid.

Masked points (gaps, logging outages) are NaN: models skip them and metrics ignore them, so an
outage is never learned as demand. `Panel.resample` is the one aggregation to hours, and it keeps
what happened inside each hour (`Panel.within`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd


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
        return self.values.index

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


def _bucket_sums(
    a: np.ndarray, labels: pd.DatetimeIndex, columns: pd.Index, index: pd.Index
) -> pd.DataFrame:
    """Column sums of `a` over each run of equal `labels` (rows sorted by time), on `index`.

    Each bucket's sum is computed from its own rows only, so later rows cannot change it even
    in the last bit (a grouped sum's rounding may depend on the rest of the frame).
    """
    if not len(a):
        return pd.DataFrame(0.0, index=index, columns=columns)
    starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
    sums = pd.DataFrame(np.add.reduceat(a, starts, axis=0), index=labels[starts], columns=columns)
    return sums.reindex(index, fill_value=0.0)


def freq_step(freq: str | pd.Timedelta) -> pd.Timedelta:
    """A frequency ("h", "min", a Timedelta) as one grid step."""
    return pd.Timedelta(pd.tseries.frequencies.to_offset(freq))


def grid_step(index: pd.DatetimeIndex) -> pd.Timedelta:
    """The spacing of a regular grid (the median, so a masked stretch does not count)."""
    return pd.Series(index).diff().median() if len(index) > 1 else pd.Timedelta(hours=1)


def _points_per_bucket(index: pd.DatetimeIndex, freq: str) -> float:
    if len(index) < 2:
        return 1.0
    return max(1.0, freq_step(freq) / grid_step(index))
