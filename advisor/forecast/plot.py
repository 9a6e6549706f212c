"""Forecast-vs-actual plot with the interval, for backtest reports (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


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
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
