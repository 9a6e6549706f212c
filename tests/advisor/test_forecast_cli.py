"""`gpu-defrag backtest` on a small long-format file writes the files with the exact columns."""

import numpy as np
import pandas as pd

from advisor.cli import main
from tests.advisor.forecast_synth import synthetic_panel

METRIC_COLUMNS = "series,horizon,model,mae,rmse,wape,smape,mase,pinball_q90,coverage_q90"


def _long_csv(tmp_path):
    p = synthetic_panel(days=21, n_series=2, seed=3)
    frame = p.values.stack().rename("value").reset_index()
    frame.columns = ["time", "series", "value"]
    frame["capacity"] = p.capacity.stack().to_numpy()
    frame = frame.drop(index=frame.index[100:110])  # a gap, masked by the reader
    path = tmp_path / "demand.csv"
    frame.to_csv(path, index=False)
    return path


def test_backtest_cli_writes_metrics_decisions_and_plot(tmp_path, capsys):
    path = _long_csv(tmp_path)
    out = tmp_path / "out"
    rc = main(
        [
            "backtest",
            str(path),
            "--horizons",
            "1,24",
            "--quantiles",
            "0.5,0.9",
            "--test-from",
            "2024-01-20",
            "--test-to",
            "2024-01-21",
            "--replays",
            "idle",
            "--windows",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    header = (out / "metrics.csv").read_text().splitlines()[0]
    assert header == METRIC_COLUMNS
    metrics = pd.read_csv(out / "metrics.csv")
    models = set(metrics["model"])
    assert {
        "advisor",
        "naive",
        "seasonal_naive_24",
        "seasonal_naive_168",
        "same_hour_mean_7d",
        "holt_winters",
    } <= models
    assert set(metrics["horizon"]) == {1, 24}
    assert np.isfinite(metrics["mae"]).all()
    decisions = pd.read_csv(out / "decisions.csv")
    assert {"replay", "series", "window_h", "model", "capture", "violation_rate"} <= set(
        decisions.columns
    )
    assert set(decisions["model"]) >= {"advisor", "half_min_past_w"}
    assert (out / "forecast.png").stat().st_size > 1000
    assert "advisor" in capsys.readouterr().out


def test_forecast_cli_prints_ordered_quantiles(tmp_path, capsys):
    path = _long_csv(tmp_path)
    assert main(["forecast", str(path), "--horizons", "1,2", "--model", "naive"]) == 0
    from io import StringIO

    frame = pd.read_csv(StringIO(capsys.readouterr().out))
    assert len(frame) == 4
    assert (frame["q0.1"] <= frame["q0.5"]).all() and (frame["q0.5"] <= frame["q0.9"]).all()
    assert (frame["q0.9"] <= frame["capacity"]).all()
