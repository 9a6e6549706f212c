"""Demand, idle-window and job-end forecasting with rolling-origin backtests.

Public API (pure: frames in, frames out): `forecast`, `idle_windows`, `backtest`, `predict_job_end`,
and the readers in `advisor.forecast.io` (`load`, `read_long`, `read_philly`, `read_helios`).
"""

from advisor.forecast.api import backtest, forecast, idle_windows, predict_job_end

__all__ = ["backtest", "forecast", "idle_windows", "predict_job_end"]
