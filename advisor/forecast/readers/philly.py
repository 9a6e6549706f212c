"""Philly's node sequence (`time, active, total` per minute): one series `philly/nodes`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from advisor.forecast.panel import Panel
from advisor.forecast.readers.checks import mask_zero_runs, on_regular_grid, per_minute

PHILLY_TEST = ("2017-12-01", "2017-12-15")


def read_philly(path: str | Path) -> Panel:
    """Philly `time, active, total` per minute: nodes with ≥ 1 job; masks gaps and logging faults.

    Philly never runs on zero nodes, so every exact zero is masked: the Oct-26 outage (18 hours)
    and the 10- and 40-minute dropouts on Dec 3 and Dec 6.
    """
    raw = per_minute(path, pd.read_csv(path, parse_dates=["time"]), "active", "total")
    raw = on_regular_grid(raw, "min")
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
