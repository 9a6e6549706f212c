"""Forecast page: numbers are the backtested forecasts of the same history, each next to its
error and the seasonal-naive baseline's; no history, no forecast (and the page says why)."""

from __future__ import annotations

import pandas as pd
import pytest

from advisor.app import data, forecasts
from advisor.fragmentation import measures
from advisor.ingest.sources import load_source
from advisor.settings import HORIZONS_H
from tests.app.conftest import frame_with, open_app, served, served_json

PAGE = "views/forecast.py"


def test_forecasts_match_the_backtest_of_the_simulated_history() -> None:
    source = "sim:a100-16x8?t=3d"
    at = open_app(source, PAGE)
    doc = served_json(source)["forecast"]
    shown = frame_with(at, "backtest WAPE")
    expected = forecasts.horizons_frame(doc)
    assert len(shown) == len(expected) > 0
    assert shown["forecast GPUs"].tolist() == expected["forecast GPUs"].tolist()
    assert shown["model"].tolist() == expected["model"].tolist()
    # every forecast carries its own error and the baseline's, measured on held-back hours
    assert shown["backtest WAPE"].notna().all()
    assert shown[f"{doc['baseline']} WAPE"].notna().all()
    assert (shown["held-back hours"] > 0).all()
    assert shown["naive WAPE"].notna().all()  # naive's too: the pick may lose to it there
    # and how often its held-back hours fell at or below its q0.9, as the service measured it
    # (blank where too few held-back hours had an interval: 24 h on 3 days)
    measured = [h["backtest"]["coverage_ratio"][h["model"]]["0.9"] for h in _available(doc)]
    nan = float("nan")
    expected_cov = [nan if m is None else m for m in measured]
    assert shown["q0.9 coverage"].tolist() == pytest.approx(expected_cov, nan_ok=True)
    assert None in measured and shown["q0.9 coverage"].isna().any()
    baseline_cov = shown[f"{doc['baseline']} q0.9 coverage"].dropna()
    assert len(baseline_cov) and baseline_cov.between(0, 1).all()
    both = shown.dropna(subset=["low (q0.1)", "high (q0.9)"])
    assert len(both) == len(shown)  # every served interval here rests on enough errors
    # at the horizons (the outlook's long ones rest on few errors: their point may lie outside)
    both = both[both["horizon"].isin([f"{h}h" for h in HORIZONS_H])]
    assert (both["low (q0.1)"] <= both["forecast GPUs"] + 1e-9).all()
    assert (both["forecast GPUs"] <= both["high (q0.9)"] + 1e-9).all()


def test_the_tenants_table_is_the_services_tenant_section() -> None:
    source = "sim:a100-16x8?t=3d"
    at = open_app(source, PAGE)
    doc = served_json(source)["forecast"]
    shown = frame_with(at, forecasts.HELD)  # the last complete hour's mean, not "now"
    expected = forecasts.tenants_frame(doc)
    assert len(shown) == len(expected) > 0
    assert set(shown["tenant"]) == {t["tenant"] for t in doc["tenants"]["tenants"]}
    assert shown["forecast GPUs"].tolist() == expected["forecast GPUs"].tolist()
    assert shown["backtest WAPE"].notna().all() and shown["naive WAPE"].notna().all()
    assert (shown["low (q0.1)"] <= shown["high (q0.9)"]).all()
    # their intervals' held-back coverage too, as the pools': the service's shares and hours
    served = [h for t in doc["tenants"]["tenants"] for h in t["horizons"] if h["available"]]
    measured = [h["backtest"]["coverage_ratio"][h["model"]]["0.9"] for h in served]
    expected_cov = [float("nan") if m is None else m for m in measured]
    assert shown["q0.9 coverage"].tolist() == pytest.approx(expected_cov, nan_ok=True)
    hours = [h["backtest"]["coverage_origins"][h["model"]] for h in served]
    assert shown["coverage hours"].tolist() == hours
    assert (shown["coverage hours"] <= shown["held-back hours"]).all()
    assert not any("now" in column for column in shown.columns)


def test_a_forecast_without_an_interval_is_a_blank_not_a_crash() -> None:
    """40 complete hours: the 24 h forecast is served with a median but too few known errors
    for an interval; its low/high cells are blank, the chart has no error bar there, and the
    page says why."""
    import numpy as np

    from advisor.app import figures
    from advisor.forecast.live import forecast_pools, tenant_section
    from tests.factories import demand_frame

    frame = demand_frame(41, noise_sd=3)
    doc = forecast_pools(frame, [1, 24])
    doc["tenants"] = tenant_section(frame.assign(pool="rnd"), [1, 24])
    for table in (forecasts.horizons_frame(doc), forecasts.tenants_frame(doc)):
        by = table.set_index("horizon")
        assert np.isnan(by.loc["24h", "low (q0.1)"]) and np.isnan(by.loc["24h", "high (q0.9)"])
        assert by.loc["1h", "low (q0.1)"] < by.loc["1h", "high (q0.9)"]
        assert by["forecast GPUs"].notna().all() and by["naive WAPE"].notna().all()
    hourly = pd.DataFrame(
        {
            "pool": "a100",
            "hour": pd.date_range("2026-01-05", periods=3, freq="h", tz="UTC"),
            "allocated_gpus": 1.0,
            "capacity_gpus": 128.0,
        }
    )
    fan = forecasts.fan_frame(doc, "a100")
    figure = figures.fan_chart(hourly, fan, "a100")
    band = next(t for t in figure.data if t.name == "forecast 10–90 %")
    assert np.isnan(np.asarray(band.y, dtype=float)[-1])  # 24 h: a gap, not a zero-width band
    (reason,) = forecasts.interval_reasons(doc)
    assert reason.startswith("24h: no interval: the model has 16 known errors") and "rnd" in reason


def _available(doc: dict) -> list[dict]:
    """The pools' available horizons as the table lists them (the outlook's included)."""
    return [h for pool in doc["pools"] for h in forecasts.all_horizons(pool) if h.get("available")]


def test_no_history_no_forecast() -> None:
    at = open_app("sim:nvlink-islands", PAGE)
    assert any("no history to forecast from" in info.value for info in at.info)
    with pytest.raises(AssertionError):
        frame_with(at, "backtest WAPE")


def test_short_history_names_the_hours_it_needs() -> None:
    doc = served_json("sim:a100-16x8?t=20h")["forecast"]
    assert forecasts.horizons_frame(doc).empty or "24h" not in set(
        forecasts.horizons_frame(doc)["horizon"]
    )
    assert any("24h: needs 36 complete hours" in r for r in forecasts.missing_reasons(doc))


def test_node_free_times_count_up_to_the_node_size() -> None:
    model = load_source("sim:a100-16x8")
    at = open_app("sim:a100-16x8", PAGE)
    free = frame_with(at, "free within 24 h")
    assert free["free now"].tolist() == measures.free_whole_per_node(model).tolist()
    cols = ["free now", "free within 1 h", "free within 6 h", "free within 24 h"]
    assert (free[cols].diff(axis=1).iloc[:, 1:] >= 0).all().all()  # only ever more free
    assert (free["free within 24 h"] <= free["GPUs"]).all()
    # a single instant: no job seen to finish, so the planner's fallback, and the caption says so
    (caption,) = [c.value for c in at.caption if "Job ends come from" in c.value]
    assert "0 finished job(s) seen, fewer than 30: the planner's fallback is used" in caption


def test_node_free_times_rest_on_the_ends_the_service_learns() -> None:
    """A simulated fleet two days in: its re-simulated past holds enough finished jobs, so the
    table plans on the ends the plan stage learns from them, and the caption says so."""
    from advisor.forecast.job_ends import JobEndSettings
    from advisor.pipeline import queries as Q

    source = "sim:a100-16x8?t=2d"
    view = served(source)
    ends, doc = view.planned_ends(), view.recommendations.job_ends.model_dump()
    assert ends and doc["finished_jobs"] >= JobEndSettings().min_finished
    at = open_app(source, PAGE)
    free = frame_with(at, "free within 24 h")
    expected = Q.free_gpus_by_node(view.model, ends)
    pd.testing.assert_frame_equal(free.reset_index(drop=True), expected, check_dtype=False)
    learned = f"forecast job ends learned from {doc['finished_jobs']} finished jobs"
    (caption,) = [c.value for c in at.caption if "Job ends come from" in c.value]
    assert learned in caption and "duration prior (Pareto" not in caption


def test_a_large_simulated_fleet_shows_its_pages_before_its_past_is_read() -> None:
    """Above 256 nodes the past is slow to simulate: the app shows a preview (one run, no
    past) first, and the Forecast page says the past is being read rather than a number."""
    source = "sim:a100-16x8?nodes=300&t=8h"
    at = open_app(source)
    shown, _ = data.latest(source)
    if shown.preview:  # the past may be read already on a fast machine
        at.switch_page(PAGE).run()
        assert any("Reading this source's past" in i.value for i in at.info)
    advisor, _ = data.get_advisor(source)
    settled, _ = advisor.latest(wait_s=300.0)
    assert not settled.preview and len(settled.view.history.trend) == 9  # hourly to t=8h


def test_the_chart_shows_the_hourly_series_the_forecasts_learn_from() -> None:
    """The history line is the served hourly series (`/api/history`'s demand): the pipeline's
    hourly panel, complete hours only, same values."""
    import numpy as np

    from advisor.forecast.runs import hourly_panel
    from advisor.pipeline import Pipeline

    source = "sim:a100-16x8?t=3d"
    at = open_app(source, PAGE)
    shown, _ = data.latest(source)
    chart = data.hourly_demand(shown)
    pipeline = Pipeline(source, frozen=True)
    pipeline.backfill()
    pipeline.run_once()
    panel = hourly_panel(pipeline.history.pool_demand())
    assert set(chart["pool"]) == set(panel.series)
    for pool, rows in chart.groupby("pool"):
        hours = rows["hour"].dt.tz_localize(None).to_numpy()
        np.testing.assert_array_equal(hours, panel.index.to_numpy())
        np.testing.assert_allclose(rows["allocated_gpus"], panel.values[pool], equal_nan=True)
    running = pipeline.history.pool_demand()["time"].max().floor("h")
    assert chart["hour"].max() < running
    assert at.get("plotly_chart")  # the fan chart drawn from it
