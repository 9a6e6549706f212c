"""Demand per tenant: the history's tenant series, the service's forecast section for the
tenants holding the most GPUs, its /metrics series and its schema."""

from __future__ import annotations

import math

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from advisor.documents import as_json, build_forecast
from advisor.forecast.live import tenant_section
from advisor.history import History
from advisor.ingest.live import LiveSim
from advisor.planner.constraints import Policy
from advisor.service.api import openapi_document
from advisor.service.loop import AdvisorLoop, Config
from advisor.settings import Settings
from tests.conftest import add_nodes

T0 = 1_700_000_000.0


def model(t: float, held: dict[str, int], waiting: dict[str, int] | None = None):
    """Two 8-GPU nodes; each tenant holds `held[tenant]` whole GPUs (placed in order)."""
    b = add_nodes(["n0", "n1"], pool="a100")
    free = [(n, i) for n in ("n0", "n1") for i in range(8)]
    for tenant, gpus in held.items():
        for k in range(gpus):
            node, index = free.pop(0)
            b.add_allocation(f"{tenant}-{k}", num_gpu=1, node=node, gpus=[index], tenant=tenant)
    for tenant, gpus in (waiting or {}).items():
        b.add_allocation(f"{tenant}-wait", num_gpu=gpus, tenant=tenant)
    return b.build(timestamp=t)


def test_tenant_series_are_zero_where_a_tenant_held_nothing():
    history = History()
    history.append(model(T0, {"rnd": 3, "prod": 2}))
    history.append(model(T0 + 60, {"prod": 4}, waiting={"rnd": 2}))
    frame = history.tenant_demand()
    by = {(row.time.timestamp(), row.pool): row for row in frame.itertuples()}
    assert by[T0, "rnd"].allocated_gpus == 3 and by[T0 + 60, "rnd"].allocated_gpus == 0
    assert by[T0 + 60, "rnd"].pending_gpus == 2 and by[T0 + 60, "prod"].allocated_gpus == 4
    assert frame["capacity_gpus"].isna().all() and len(frame) == 4
    pools = history.pool_demand().groupby("time")["allocated_gpus"].sum()
    assert frame.groupby("time")["allocated_gpus"].sum().tolist() == pools.tolist()


def hourly(hours: int) -> History:
    history = History(max_points=10_000)
    for h in range(hours):
        day = 1 + math.sin(2 * math.pi * h / 24)
        history.append(
            model(T0 + 3600 * h, {"rnd": round(4 + 3 * day), "prod": 2, "tiny": 1 if h % 2 else 0})
        )
    return history


def test_the_tenants_holding_the_most_gpus_get_backtested_forecasts():
    section = tenant_section(hourly(60).tenant_demand(), (1, 24), max_tenants=2)
    assert section["error"] is None and section["tenants_total"] == 3
    assert [t["tenant"] for t in section["tenants"]] == ["prod", "rnd"]  # not "tiny"
    for tenant in section["tenants"]:
        for h in tenant["horizons"]:
            assert h["available"], h
            assert section["baseline"] in h["backtest"]["wape_ratio"]
            q = h["quantiles"]
            assert 0 <= q["0.1"] <= q["0.5"] <= q["0.9"]
    assert tenant_section(hourly(60).tenant_demand(), (1,), max_tenants=0)["tenants"] == []
    short = tenant_section(hourly(10).tenant_demand(), (24,))
    assert not any(h["available"] for t in short["tenants"] for h in t["horizons"])


def test_each_tenant_is_served_with_its_quota():
    quotas = {"prod": 4.0}
    section = tenant_section(hourly(40).tenant_demand(), (1,), max_tenants=3, quotas=quotas)
    assert {t["tenant"]: t["quota_gpus"] for t in section["tenants"]} == {
        "prod": 4.0,
        "rnd": None,
        "tiny": None,
    }


def test_a_failure_is_reported_in_the_section():
    broken = hourly(30).tenant_demand().drop(columns="allocated_gpus")
    section = tenant_section(broken, (1,))
    assert section["tenants"] == [] and "allocated_gpus" in section["error"]


@pytest.fixture(scope="module")
def sim_state():
    source = LiveSim("sim:a100-16x8?nodes=4", clock=lambda: 0.0)
    policy = Policy(quotas={("rnd", ""): 24.0, ("rnd", "A100"): 8.0})  # per model: not shown
    config = Config(settings=Settings(horizons_h=(1, 6), max_tenants=2, policy=policy))
    loop = AdvisorLoop("sim:a100-16x8?nodes=4", source, config)
    loop.seed_history(source.backfill(48 * 3600.0))
    loop.run_once()
    return loop


def test_the_service_serves_and_exports_the_tenants(sim_state):
    state = sim_state.state()
    section = state.results.forecast["tenants"]
    assert section["max_tenants"] == 2 and len(section["tenants"]) == 2
    assert section["tenants_total"] >= 2
    page = sim_state.current_page().body.decode()
    shown = {
        tuple(line.split("{")[1].split("}")[0].split(","))
        for line in page.splitlines()
        if line.startswith("gpu_advisor_forecast_tenant_demand_gpus{")
    }
    expected = {
        (f'forecast_quantile="{q}"', f'horizon="{h["horizon"]}"', f'tenant="{t["tenant"]}"')
        for t in section["tenants"]
        for h in t["horizons"]
        if h["available"]
        for q in h["quantiles"]
    }
    assert shown == expected and shown
    quota = {t["tenant"]: t["quota_gpus"] for t in section["tenants"]}
    assert quota["rnd"] == 24.0 and set(quota.values()) == {24.0, None}  # the other: none
    quota_lines = [
        line
        for line in page.splitlines()
        if line.startswith("gpu_advisor_forecast_tenant_quota_gpus{")
    ]
    assert quota_lines == (
        ['gpu_advisor_forecast_tenant_quota_gpus{tenant="rnd"} 24.0'] if "rnd" in quota else []
    )
    assert page.count("gpu_advisor_forecast_tenant_backtest_wape_ratio{") == sum(
        len(h["backtest"]["wape_ratio"])  # a series per model the document scores
        for t in section["tenants"]
        for h in t["horizons"]
        if h["available"]
    )
    # the tenants' interval coverage, as the pools': every served share and its hours
    served = {
        (t["tenant"], h["horizon"]): h["backtest"]
        for t in section["tenants"]
        for h in t["horizons"]
        if h["available"]
    }
    families_ = {f.name: f for f in text_string_to_metric_families(page)}
    ratios = {
        (
            s.labels["tenant"],
            s.labels["horizon"],
            s.labels["model"],
            s.labels["forecast_quantile"],
        ): (s.value)
        for s in families_["gpu_advisor_forecast_tenant_backtest_coverage_ratio"].samples
    }
    assert ratios == {
        (*key, model, q): share
        for key, b in served.items()
        for model, shares in b["coverage_ratio"].items()
        for q, share in shares.items()
        if share is not None
    }
    counts = {
        (s.labels["tenant"], s.labels["horizon"], s.labels["model"]): s.value
        for s in families_["gpu_advisor_forecast_tenant_backtest_coverage_origins"].samples
    }
    assert counts and counts == {
        (*key, model): n for key, b in served.items() for model, n in b["coverage_origins"].items()
    }
    body = as_json(build_forecast(state))
    spec = openapi_document()
    schema = {**spec["components"]["schemas"]["Forecast"], "components": spec["components"]}
    jsonschema.validate(body, schema)
    del body["tenants"]["tenants"][0]["tenant"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, schema)


def test_the_limit_comes_from_the_command_line():
    from advisor.cli import build_parser
    from advisor.settings import MAX_TENANTS

    args = build_parser().parse_args(["advise", "--source", "x", "--forecast.max-tenants", "5"])
    assert args.max_tenants == 5
    assert build_parser().parse_args(["advise", "--source", "x"]).max_tenants == MAX_TENANTS
