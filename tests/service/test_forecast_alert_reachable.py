"""The capacity alert compares what the advisor serves: a full pool's forecast must be able to
meet it. Allocated GPUs cannot exceed capacity and the forecast is clipped there, so the alert's
`>=` is the comparison that can fire (a `>` never did)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import yaml

from advisor.forecast.live import forecast_pools
from alerts.generate import ROOT


def _full_pool(hours: int = 96, capacity: float = 128.0) -> pd.DataFrame:
    """A pool at capacity nearly all the time, with jobs waiting: the alert's case."""
    rng = np.random.default_rng(0)
    times = pd.date_range("2026-01-01", periods=hours * 4, freq="15min", tz="UTC")
    dips = rng.random(len(times)) < 0.05
    allocated = np.where(dips, capacity - rng.integers(1, 8, len(times)), capacity)
    return pd.DataFrame(
        {
            "time": times,
            "pool": "a100",
            "allocated_gpus": allocated.astype(float),
            "held_gpus": allocated.astype(float),
            "capacity_gpus": capacity,
            "pending_gpus": 24.0,
        }
    )


def test_a_full_pools_served_quantiles_meet_the_alerts_comparison() -> None:
    doc = forecast_pools(_full_pool(), (1, 6))
    (pool,) = doc["pools"]
    served = [h for h in pool["horizons"] if h["available"]]
    assert served
    for h in served:
        upper = h["quantiles"]["0.9"]
        assert upper <= pool["capacity_gpus"]  # clipped: `>` capacity can never hold
        assert upper >= pool["capacity_gpus"], h  # `>=` does: the warning fires


def test_the_rules_compare_with_at_or_above() -> None:
    rules = yaml.safe_load((ROOT / "alerts" / "prometheus_alerts.yaml").read_text())
    exprs = [
        rule["expr"]
        for group in rules["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "GpuForecastDemandExceedsCapacity"
    ]
    assert len(exprs) == 2
    assert all(">= on (job, instance, pool)" in expr for expr in exprs)
