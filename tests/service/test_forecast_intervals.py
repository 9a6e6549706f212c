"""Intervals only where there are errors to build them from, coverage only over real intervals,
and naive's held-back score served beside the pick's: in the models, /api/forecast (and its
schema), /metrics."""

from __future__ import annotations

from dataclasses import replace

import jsonschema
import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from advisor.documents import as_json, build_forecast
from advisor.forecast.live import BASELINE, MIN_COVERAGE_ORIGINS, forecast_pools, tenant_section
from advisor.forecast.models import MIN_INTERVAL_ERRORS, make, sort_quantiles
from advisor.service.api import openapi_document
from advisor.service.loop import AdvisorLoop, Config
from advisor.service.metrics import families
from tests.factories import demand_frame

QS = (0.1, 0.5, 0.9)


def series(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray, pd.DatetimeIndex]:
    rng = np.random.default_rng(seed)
    y = (50 + np.cumsum(rng.normal(0, 2, n)))[:, None]
    return y, np.full_like(y, 500.0), pd.date_range("2026-01-01", periods=n, freq="h")


@pytest.mark.parametrize("name", ["naive", "seasonal_naive_24", "holt_winters", "last_reading"])
def test_too_few_errors_is_no_interval_not_a_zero_width_one(name):
    y, cap, t = series()
    at = np.array([30])
    for until, errors in (
        (0, 0),
        (1, 1),
        (2, 2),
        (MIN_INTERVAL_ERRORS - 1, MIN_INTERVAL_ERRORS - 1),
    ):
        model = make(name, QS).fit(y, cap, t, until, [1])
        qs = model.predict_quantiles(y, cap, t, at, 1, QS)
        assert np.isnan(qs[0.1]).all() and np.isnan(qs[0.9]).all()
        assert model.known_errors(1, 1).tolist() == [errors]
        # the median is unchanged: the point plus the median of the errors it has
        point = model.predict(y, cap, t, at, 1)
        resid = model._resid[1]
        assert qs[0.5] == pytest.approx(point + np.median(resid, axis=0))
    model = make(name, QS).fit(y, cap, t, MIN_INTERVAL_ERRORS, [1])
    assert model.known_errors(1, 1).tolist() == [MIN_INTERVAL_ERRORS]
    qs = model.predict_quantiles(y, cap, t, at, 1, QS)
    assert np.isfinite(qs[0.1]).all() and (qs[0.1] < qs[0.9]).all()


def test_masked_errors_do_not_count():
    y, cap, t = series()
    y[5:15] = np.nan  # ten targets masked: their errors are unknown
    model = make("naive", QS).fit(y, cap, t, 30, [1])
    assert np.isnan(model.predict_quantiles(y, cap, t, np.array([30]), 1, QS)[0.9]).all()
    assert model.known_errors(1, 1).tolist() == [30 - 10]  # 30 origins, 10 targets masked


def test_a_missing_interval_does_not_move_the_median():
    qs = {0.1: np.array([np.nan, 1.0]), 0.5: np.array([4.0, 3.0]), 0.9: np.array([np.nan, 2.0])}
    out = sort_quantiles(qs)
    assert out[0.5].tolist() == [4.0, 2.0]  # np.sort alone would put the NaN there: [nan, 2]
    assert np.isnan(out[0.1][0]) and np.isnan(out[0.9][0])
    assert out[0.1][1] == 1.0 and out[0.9][1] == 3.0  # finite levels still un-crossed
    plain = {q: np.random.default_rng(1).normal(size=(4, 3)) for q in QS}
    stacked = np.sort(np.stack([plain[q] for q in QS]), axis=0)
    assert all(np.array_equal(sort_quantiles(plain)[q], stacked[i]) for i, q in enumerate(QS))


def test_a_horizon_without_enough_errors_serves_no_interval_and_says_why():
    doc = forecast_pools(
        demand_frame(41, noise_sd=3), [1, 24]
    )  # 40 complete hours: 24 h has 16 errors
    (pool,) = doc["pools"]
    assert doc["history_hours"] == 40
    h1, h24 = pool["horizons"]
    assert h24["available"] and h24["interval_reason"].startswith("no interval: the model has 16")
    assert h24["quantiles"]["0.1"] is None and h24["quantiles"]["0.9"] is None
    assert h24["quantiles"]["0.5"] is not None  # the median is still served
    assert h1["interval_reason"] is None and None not in h1["quantiles"].values()
    assert h1["quantiles"]["0.1"] < h1["quantiles"]["0.9"]


def test_held_back_coverage_counts_only_origins_with_an_interval():
    """72 complete hours (the default sim backfill). 24 h: origins 0..47, held back 24..47, fitted
    at hour 24 on one error: no interval for naive and the baseline, so no coverage (it was 0.54
    for q0.1 and q0.9 alike: zero-width intervals); the advisor has its 24 errors only at hour 47:
    one hour, too few to serve a coverage. 6 h: held back 33..65; naive's and the baseline's fitted at 24
    (19 errors) have no interval, those fitted at 48 (43 errors) do: 18 hours; the advisor's is
    calibrated at each origin on its errors known there (28 at hour 33): all 33 hours."""
    doc = forecast_pools(demand_frame(73, noise_sd=3), [6, 24])
    assert doc["history_hours"] == 72
    h6, h24 = doc["pools"][0]["horizons"]
    assert h24["backtest"]["test_origins"] == 24
    for model, shares in h24["backtest"]["coverage_ratio"].items():
        assert shares == {"0.1": None, "0.9": None}
        assert h24["backtest"]["coverage_origins"][model] == (model == h24["model"])
    assert h6["backtest"]["test_origins"] == 33
    counts = h6["backtest"]["coverage_origins"]
    assert counts == {h6["model"]: 33, BASELINE: 18, "naive": 18}
    assert MIN_COVERAGE_ORIGINS <= 18
    for shares in h6["backtest"]["coverage_ratio"].values():
        assert 0 <= shares["0.1"] <= shares["0.9"] <= 1


def test_where_the_pick_is_naive_its_served_scores_are_the_advisors_own():
    """A flat pool: nothing beats naive, so the advisor is naive; the held-back coverage served
    under "naive" is that of the advisor's own (conformal) interval, the one it serves, counted
    at every held-back hour with 24 known errors (33), not naive's refit-time interval (18)."""
    frame = demand_frame(73)
    frame["allocated_gpus"] = 40.0
    (h6,) = forecast_pools(frame, [6])["pools"][0]["horizons"]
    assert h6["model"] == "naive"
    assert h6["backtest"]["coverage_origins"] == {"naive": 33, BASELINE: 18}


def test_coverage_over_fewer_than_the_minimum_is_null_with_its_count():
    doc = forecast_pools(
        demand_frame(62, noise_sd=3), [6]
    )  # 61 hours: held back 28..54, fitted at 48: 7 of them
    (h6,) = doc["pools"][0]["horizons"]
    counts, shares = h6["backtest"]["coverage_origins"], h6["backtest"]["coverage_ratio"]
    assert counts == {h6["model"]: 26, BASELINE: 7, "naive": 7}  # the advisor: 24 errors at 29
    assert shares[BASELINE] == shares["naive"] == {"0.1": None, "0.9": None}
    assert None not in shares[h6["model"]].values()


def test_naive_is_scored_on_the_held_back_hours_and_the_pick_is_not_changed_by_it():
    """A daily cycle that goes flat for the last 60 hours: the earlier half picks the seasonal
    model, which then loses to naive on the held-back hours. Both scores are served; the pick
    stays the earlier half's (choosing by the held-back half would make its score in-sample)."""
    frame = demand_frame(24 * 5)
    flat = frame["time"] >= frame["time"].iloc[-1] - pd.Timedelta(hours=60)
    frame.loc[flat, "allocated_gpus"] = 55.0
    (h6,) = forecast_pools(frame, [6])["pools"][0]["horizons"]
    wape, backtest = h6["backtest"]["wape_ratio"], h6["backtest"]
    assert h6["model"] != "naive" and set(wape) == {h6["model"], BASELINE, "naive"}
    assert wape["naive"] < wape[h6["model"]] / 10  # naive wins the held-back hours, and it shows
    assert set(backtest["coverage_ratio"]) == set(wape) == set(backtest["coverage_origins"])
    # the history without the flat end picks the same: the held-back hours chose nothing
    (before,) = forecast_pools(demand_frame(24 * 5), [6])["pools"][0]["horizons"]
    assert before["model"] == h6["model"]


def samples(page: str) -> list:
    return [s for family in text_string_to_metric_families(page) for s in family.samples]


def page_and_body(islands, scripted, doc: dict, tenants: dict | None = None) -> tuple[str, dict]:
    state = AdvisorLoop("snap", scripted(islands), Config()).run_once()
    forecast = {**doc, "stale": False}
    if tenants is not None:
        forecast["tenants"] = tenants
    state = replace(state, results=replace(state.results, forecast=forecast))
    return families(state).text(), as_json(build_forecast(state))


def test_null_intervals_validate_and_are_absent_from_metrics(islands, scripted):
    frame = demand_frame(41, noise_sd=3)
    doc = forecast_pools(frame, [1, 24])
    tenants = tenant_section(frame.assign(pool="rnd"), [1, 24])
    page, body = page_and_body(islands, scripted, doc, tenants)
    spec = openapi_document()
    schema = {**spec["components"]["schemas"]["Forecast"], "components": spec["components"]}
    jsonschema.validate(body, schema)  # null quantiles, a reason, counts: all declared
    assert body["pools"][0]["horizons"][1]["quantiles"]["0.9"] is None
    demand = {
        (s.labels["horizon"], s.labels["forecast_quantile"])
        for s in samples(page)
        if s.name == "gpu_advisor_forecast_demand_gpus"
    }
    assert demand == {("1h", "0.1"), ("1h", "0.5"), ("1h", "0.9"), ("24h", "0.5")}
    tenant = {
        (s.labels["horizon"], s.labels["forecast_quantile"])
        for s in samples(page)
        if s.name == "gpu_advisor_forecast_tenant_demand_gpus"
    }
    assert tenant == demand
    assert "NaN" not in page
    wape = {
        s.labels["model"]
        for s in samples(page)
        if s.name == "gpu_advisor_forecast_backtest_wape_ratio"
    }
    assert "naive" in wape and BASELINE in wape
    tenant_wape = {
        s.labels["model"]
        for s in samples(page)
        if s.name == "gpu_advisor_forecast_tenant_backtest_wape_ratio"
    }
    assert "naive" in tenant_wape


def test_a_nan_value_is_never_a_sample(islands, scripted):
    doc = forecast_pools(demand_frame(73, noise_sd=3), [1, 24])
    h1 = doc["pools"][0]["horizons"][0]
    h1["quantiles"]["0.9"] = float("nan")  # a NaN that slipped through: left out, not written
    h1["backtest"]["coverage_ratio"][BASELINE]["0.1"] = float("nan")
    page, _ = page_and_body(islands, scripted, doc)
    assert "NaN" not in page
    names = {
        (s.name, s.labels.get("forecast_quantile"), s.labels.get("horizon")) for s in samples(page)
    }
    assert ("gpu_advisor_forecast_demand_gpus", "0.9", "1h") not in names
    assert ("gpu_advisor_forecast_demand_gpus", "0.1", "1h") in names


def test_schema_describes_hourly_values_not_now():
    from tests.service.conftest import follow

    spec = openapi_document()["components"]["schemas"]
    pool = follow(spec, spec["Forecast"]["properties"]["pools"]["items"])["properties"]
    assert "last complete hour" in pool["allocated_gpus"]["description"]
    tenant = follow(spec, spec["TenantDemand"]["properties"]["tenants"]["items"])["properties"]
    assert "last complete hour" in tenant["allocated_gpus"]["description"]
    for part in ("pools", "nodes"):
        idle = follow(spec, spec["IdleWindows"]["properties"][part]["items"])["properties"]
        assert "last complete hour" in idle["current_idle_gpus"]["description"]
