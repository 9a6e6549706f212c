"""Demand, idle-window and job-end forecasting with rolling-origin backtests.

Public API (pure: frames in, frames out): `forecast`, `idle_windows`, `backtest`, `predict_job_end`;
`advisor.forecast.io.load` opens any INPUT (one reader per format in `advisor.forecast.readers`);
the advisor's rule is `advisor.forecast.selection`; what the service serves is built by
`advisor.forecast.live` (demand, tenants), `live_idle` (idle windows) and `job_ends`.
"""

from advisor.forecast.api import backtest, forecast, idle_windows, predict_job_end

__all__ = ["backtest", "forecast", "idle_windows", "predict_job_end"]
