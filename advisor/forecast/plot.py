"""Forecast-vs-actual plot with the interval, for backtest reports (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd


def _save(fig: Any, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_backtest(
    fc: pd.DataFrame, path: str | Path, model: str = "advisor", max_series: int = 4
) -> Path:
    """One panel per series (first `max_series`) and horizon: actual, median, P10–P90 band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sub = fc[fc["model"] == model]
    series = list(dict.fromkeys(sub["series"]))[:max_series]
    horizons = sorted(sub["horizon"].unique())
    fig, axes = plt.subplots(
        len(series), len(horizons), figsize=(6 * len(horizons), 2.6 * len(series)), squeeze=False
    )
    qcols = sorted(c for c in sub.columns if c.startswith("q") and c != "q0.5")
    for i, s in enumerate(series):
        for j, h in enumerate(horizons):
            ax = axes[i][j]
            g = sub[(sub["series"] == s) & (sub["horizon"] == h)].sort_values("origin")
            t = pd.to_datetime(g["origin"]) + pd.to_timedelta(h, unit="h")
            if len(qcols) >= 2:
                ax.fill_between(
                    t, g[qcols[0]], g[qcols[-1]], alpha=0.25, label=f"{qcols[0]}–{qcols[-1]}"
                )
            elif qcols:
                ax.plot(t, g[qcols[0]], ls=":", label=qcols[0])
            ax.plot(t, g["actual"], color="black", lw=1, label="actual")
            ax.plot(t, g["point"], lw=1, label=f"{model} median")
            ax.set_title(f"{s}  h={h}", fontsize=9)
            ax.tick_params(labelsize=7)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    return _save(fig, path)


def plot_power_pareto(
    decisions: pd.DataFrame, path: str | Path, budget: float = 0.43, max_x: float = 3.0
) -> Path:
    """Power-down replay: % node-hours off against shortfall events per day, one curve per forecast
    over the CES buffer (the "sweep" rows), the published-setting and tuned points marked, the
    shortfall budget as a line; x cut at `max_x` events/day (the region a policy would run in)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    power = decisions[decisions["replay"] == "power_down"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for model, g in power[power["policy"] == "sweep"].groupby("model", sort=False):
        # in buffer order (as written), so each curve is one forecast's policy family
        ax.plot(g["shortfalls_per_day"], g["pct_node_hours_off"], marker=".", lw=1, label=model)
    for marker, policy in (("s", "ces_skeleton"), ("*", "ces_tuned")):
        pts = power[power["policy"] == policy]
        if len(pts):
            ax.scatter(
                pts["shortfalls_per_day"],
                pts["pct_node_hours_off"],
                marker=marker,
                s=60,
                color="black",
                zorder=3,
                label=policy,
            )
    ax.axvline(budget, color="grey", ls="--", lw=1, label=f"{budget:g}/day budget")
    ax.set_xlim(0, max_x)
    ax.set_xlabel("shortfall events per day")
    ax.set_ylabel("% node-hours powered off")
    ax.set_title("Power-down replay: savings vs shortfalls (CES buffer swept)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)
