"""Reservation-cost replay: what holding capacity at a forecast's upper quantile costs and misses.

At each origin a reservation of the q-quantile forecast for hour origin + h is held; over the test
part, per series × horizon × model, it reserved `reserved_idle_unit_hours` = Σ max(q − y, 0) above
use (GPU- or node-hours held idle), and use exceeded it in `short_hours` hours by
`short_unit_hours` = Σ max(y − q, 0) in all. A forecast is better when both are smaller; at equal
coverage the one with less idle reservation wins. The panel is hourly, so each forecast row is one
hour. Rows go to decisions.csv beside the idle-window and power-down replays.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = (
    "replay",
    "series",
    "horizon",
    "model",
    "quantile",
    "hours",
    "reserved_idle_unit_hours",
    "short_hours",
    "short_unit_hours",
    "short_hours_pct",
)


def replay(fc: pd.DataFrame, q: float = 0.9) -> pd.DataFrame:
    """Per series × horizon × model holding the `q{q}` forecast column (`rolling.run`'s test-part
    forecasts); masked hours (NaN actual) are left out. Empty when no model has the quantile."""
    col = f"q{q:g}"
    if col not in fc.columns or fc.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    rows = []
    for (series, horizon, model), g in fc.groupby(["series", "horizon", "model"], sort=False):
        y, held = g["actual"].to_numpy(float), g[col].to_numpy(float)
        ok = np.isfinite(y) & np.isfinite(held)
        if not ok.any():
            continue
        y, held = y[ok], held[ok]
        short = y > held
        rows.append(
            {
                "replay": "reservation",
                "series": series,
                "horizon": int(horizon),
                "model": model,
                "quantile": q,
                "hours": int(ok.sum()),
                "reserved_idle_unit_hours": float(np.maximum(held - y, 0).sum()),
                "short_hours": int(short.sum()),
                "short_unit_hours": float(np.maximum(y - held, 0).sum()),
                "short_hours_pct": float(100 * short.mean()),
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))
