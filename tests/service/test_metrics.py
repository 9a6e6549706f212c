"""Results → advisor contract metrics: names and labels from the contract, values that agree
with the analysis, bounded action info, and a page promtool and prometheus_client accept."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from advisor.contract import ADVISOR_BY_NAME, ADVISOR_METRICS, GPU_STATE_CODES
from advisor.history import pool_rows
from advisor.ingest.live import LiveSim
from advisor.planner.constraints import Policy
from advisor.service.loop import AdvisorLoop, Config
from advisor.service.metrics import families
from advisor.settings import Settings
from tests.conftest import add_nodes


def samples(page: str) -> list:
    return [s for family in text_string_to_metric_families(page) for s in family.samples]


@pytest.fixture(scope="module")
def islands_state(islands):
    from tests.service.conftest import ScriptedSource

    return AdvisorLoop("snap", ScriptedSource(islands), Config(top_actions=2)).run_once()


@pytest.fixture(scope="module")
def sim_loop():
    source = LiveSim("sim:a100-16x8?nodes=4", clock=lambda: 0.0)
    # a quota above the fleet's 32 GPUs: shown beside rnd's demand forecast, binding nothing
    policy = Policy(quotas={("rnd", ""): 64.0})
    loop = AdvisorLoop(
        "sim:a100-16x8?nodes=4", source, Config(settings=Settings(horizons_h=(1, 6), policy=policy))
    )
    # five days: enough for every idle window's held-back backtest (`idle_needs(8)` = 112 h)
    loop.seed_history(source.backfill(120 * 3600.0))
    loop.run_once()
    return loop


def test_contract_names_follow_conventions():
    for spec in ADVISOR_METRICS:
        assert spec.name.startswith("gpu_advisor_"), spec.name
        assert (spec.kind == "counter") == spec.name.endswith("_total"), spec.name
        assert (spec.kind == "info") == spec.name.endswith("_info"), spec.name
        assert "percent" not in spec.name and "_mb" not in spec.name, spec.name
        # promtool's lint: base units only (seconds, not hours or minutes)
        assert not spec.name.endswith(("_hours", "_minutes", "_days", "_milliseconds")), spec.name
        # target labels: Prometheus would rename ours to exported_job / exported_instance
        assert not {"job", "instance"} & set(spec.labels), spec.name
    assert len(ADVISOR_BY_NAME) == len(ADVISOR_METRICS)


def test_every_sample_is_a_contract_metric_with_its_labels(islands_state, sim_loop):
    specs = {spec.name: spec for spec in ADVISOR_METRICS}
    pages = [families(islands_state).text(), sim_loop.current_page().body.decode()]
    for page in pages:
        for sample in samples(page):
            spec = specs.get(sample.name)
            assert spec is not None, f"{sample.name} is not in advisor/contract.py"
            assert set(sample.labels) == set(spec.labels), sample


def test_every_contract_metric_is_served(islands_state, sim_loop, power_state):
    served = {s.name for s in samples(families(islands_state).text())}
    served |= {s.name for s in samples(families(power_state).text())}
    served |= {s.name for s in samples(sim_loop.current_page().body.decode())}
    served |= {s.name for s in samples(families(scheduler_state()).text())}
    assert served == set(ADVISOR_BY_NAME)


def scheduler_state():
    """A scheduler source's run: no rack known, a waiting 2 x 8 gang (the queue)."""
    import dataclasses

    from advisor.model import ModelBuilder
    from advisor.scheduler_view import SchedulerFacts
    from tests.service.conftest import ScriptedSource

    b = ModelBuilder()
    for n in ("a", "b"):
        b.add_node(n, pool="train", gpu_model="A100")
        for index in range(8):
            b.add_gpu(n, index)
    for i in range(2):
        b.add_allocation(f"rnd/gang-{i}", num_gpu=8, job="rnd/gang", tenant="rnd")
    model = dataclasses.replace(
        b.build(timestamp=100.0), scheduler=SchedulerFacts("kubernetes"), _cache={}
    )
    return AdvisorLoop("k8s:", ScriptedSource(model), Config()).run_once()


def test_scheduler_series_say_rack_unknown_and_the_queue():
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for s in samples(families(scheduler_state()).text())
        if s.name.startswith(
            (
                "gpu_advisor_nodes_rack",
                "gpu_advisor_shape_unsched",
                "gpu_advisor_pending",
                "gpu_advisor_schedulable_jobs_if",
            )
        )
    }
    assert got[("gpu_advisor_nodes_rack_unknown", (("pool", "train"),))] == 2
    assert (
        got[("gpu_advisor_schedulable_jobs_if_racks_allow", (("pool", "train"), ("shape", "2x8")))]
        == 1
    )
    assert (
        got[("gpu_advisor_shape_unschedulable", (("cause", "rack_unknown"), ("shape", "2x8")))]
        == 16
    )
    assert got[("gpu_advisor_pending_jobs", (("tenant", "rnd"),))] == 1
    assert got[("gpu_advisor_pending_gpus", (("tenant", "rnd"),))] == 16
    # every measured shape has a series per cause, 0 where that cause does not block it
    assert got[("gpu_advisor_shape_unschedulable", (("cause", "scattered"), ("shape", "2x8")))] == 0
    assert got[("gpu_advisor_shape_unschedulable", (("cause", "quota"), ("shape", "8")))] == 0


@pytest.fixture(scope="module")
def power_state():
    """Two idle allocated GPUs draw 70 W and 80 W, a busy one 300 W, a free one 60 W (pool
    `train`); an idle GPU in pool `infer` has no reading, so that pool has no power series."""
    from advisor.model import ModelBuilder
    from tests.service.conftest import ScriptedSource

    b = ModelBuilder()
    b.add_node("t1", pool="train", rack="r1", gpu_model="A100")
    b.add_node("i1", pool="infer", rack="r1", gpu_model="A100")
    for index, watts in enumerate((70.0, 80.0, 300.0, 60.0)):
        b.add_gpu("t1", index, memory_total_bytes=80e9, power_watts=watts)
    b.add_gpu("i1", 0, memory_total_bytes=80e9)
    b.add_allocation("idle", num_gpu=2, node="t1", gpus=[0, 1], tenant="a")
    b.add_allocation("busy", num_gpu=1, node="t1", gpus=[2], tenant="a")
    b.add_allocation("idle-unknown", num_gpu=1, node="i1", gpus=[0], tenant="b")
    times = [0.0, 1800.0, 3600.0, 5400.0]
    util = np.zeros((4, 5), dtype=np.float32)
    util[:, 2] = 0.9
    memory = np.zeros((4, 5), dtype=np.float32)
    model = b.build(timestamp=5400.0, usage=(times, util, memory))
    return AdvisorLoop("snap", ScriptedSource(model), Config()).run_once()


def test_idle_power_is_the_observed_draw_of_allocated_idle_gpus(power_state):
    served = {
        s.labels["pool"]: s.value
        for s in samples(families(power_state).text())
        if s.name == "gpu_advisor_allocated_idle_power_watts"
    }
    assert served == {"train": 150.0}


def test_page_is_byte_identical_to_prometheus_client(islands_state):
    fams = families(islands_state)

    class Collector:
        def collect(self):
            return fams.metric_families()

    registry = CollectorRegistry()
    registry.register(Collector())
    assert fams.text().encode() == generate_latest(registry)


def test_promtool_check_metrics_accepts_every_family(islands_state, power_state, sim_loop):
    """Linted on pages that together serve every contract family: ranked actions (islands),
    idle power, forecasts with idle windows and a tenant's quota (the sim), and a scheduler
    source's queue."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not installed: run `make system` (Debian package prometheus)")
    pages = [
        families(islands_state).text().encode(),
        families(power_state).text().encode(),
        sim_loop.current_page().body,
        families(scheduler_state()).text().encode(),
    ]
    linted = {s.name for page in pages for s in samples(page.decode())}
    assert linted == set(ADVISOR_BY_NAME)
    for page in pages:
        result = subprocess.run(
            [promtool, "check", "metrics"], input=page, capture_output=True, timeout=30
        )
        assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_values_agree_with_the_analysis(islands_state):
    results = islands_state.results
    analysis = results.analysis
    by_name: dict[str, list] = {}
    for sample in samples(families(islands_state).text()):
        by_name.setdefault(sample.name, []).append(sample)

    def total(name: str) -> float:
        return sum(s.value for s in by_name[name])

    assert total("gpu_advisor_free_gpus") == analysis["spatial"]["free_gpus"]
    # the demand forecast's own quantity, per pool: the history's allocated GPU share
    allocated = {s.labels["pool"]: s.value for s in by_name["gpu_advisor_allocated_gpus"]}
    assert allocated == pytest.approx(
        {row["pool"]: row["allocated_gpus"] for row in pool_rows(results.model)}
    )
    assert total("gpu_advisor_allocated_gpus") == pytest.approx(
        analysis["cluster"]["allocated_gpus"]
    )
    assert total("gpu_advisor_fragmented_gpus") == pytest.approx(analysis["fgd"]["fragment_gpus"])
    assert total("gpu_advisor_allocated_idle_gpus") == analysis["temporal"]["allocated_idle_gpus"]
    states = Counter(int(s.value) for s in by_name["gpu_advisor_gpu_state"])
    assert states[GPU_STATE_CODES["free"]] == analysis["spatial"]["free_gpus"]
    assert states[GPU_STATE_CODES["unhealthy"]] == len(results.model.gpus) - int(
        results.model.gpu_usable.sum()
    )
    assert sum(states.values()) == len(results.model.gpus)
    fit: Counter[str] = Counter()
    for sample in by_name["gpu_advisor_schedulable_jobs"]:
        fit[sample.labels["shape"]] += sample.value  # one series per pool and shape
    pools = {row["pool"] for row in results.pools}
    assert {s.labels["pool"] for s in by_name["gpu_advisor_schedulable_jobs"]} == pools
    assert fit["8"] == 0 and fit["1"] == analysis["spatial"]["shapes"][1]["jobs_that_fit"]
    assert fit == {row["shape"]: row["schedulable_jobs"] for row in results.shapes}
    largest = by_name["gpu_advisor_largest_schedulable_job_gpus"][0].value
    assert largest == analysis["spatial"]["largest_job"]["single_node_gpus"]


def test_action_info_is_bounded_to_the_top_n_and_counts_cover_all(islands_state):
    recs = islands_state.results.recommendations
    assert len(recs["actions"]) > 2  # more actions than the bound
    page = families(islands_state, top_actions=2).text()
    info = [s for s in samples(page) if s.name == "gpu_advisor_action_info"]
    assert [s.labels["rank"] for s in info] == ["1", "2"]
    assert all(s.value == 1.0 for s in info)
    assert info[0].labels["kind"] == recs["actions"][0]["kind"]
    # each action names its plan's goal: alternatives from different goals are told apart
    assert [s.labels["goal"] for s in info] == [a["goal"] for a in recs["actions"][:2]]
    assert all(s.labels["goal"] in recs["goals"] for s in info)
    counts = {
        s.labels["kind"]: s.value
        for s in samples(page)
        if s.name == "gpu_advisor_recommended_actions"
    }
    assert sum(counts.values()) == len(recs["actions"])
    costs = [s for s in samples(page) if s.name == "gpu_advisor_action_cost_gpu_seconds"]
    assert [s.value for s in costs] == [
        pytest.approx(a["cost_gpu_hours"] * 3600) for a in recs["actions"][:2]
    ]
    assert any(s.value > 0 for s in costs)
    none = [s.name for s in samples(families(islands_state, top_actions=0).text())]
    assert "gpu_advisor_action_info" not in none


def test_forecast_series_only_for_backtested_horizons(sim_loop):
    page = sim_loop.current_page().body.decode()
    demand = [s for s in samples(page) if s.name == "gpu_advisor_forecast_demand_gpus"]
    assert {(s.labels["horizon"], s.labels["forecast_quantile"]) for s in demand} == {
        (h, q) for h in ("1h", "6h") for q in ("0.1", "0.5", "0.9")
    }
    wape = [s for s in samples(page) if s.name == "gpu_advisor_forecast_backtest_wape_ratio"]
    assert "seasonal_naive_24" in {s.labels["model"] for s in wape}
    assert all(0 <= s.value < 5 for s in wape)
    covered = [s for s in samples(page) if s.name == "gpu_advisor_forecast_backtest_coverage_ratio"]
    assert {s.labels["forecast_quantile"] for s in covered} == {"0.1", "0.9"}
    assert {s.labels["model"] for s in wape} == {s.labels["model"] for s in covered}
    assert all(0 <= s.value <= 1 for s in covered)
    doc = sim_loop.state().results.forecast
    served = {(e["pool"], h["horizon"]): h for e in doc["pools"] for h in e["horizons"]}
    info = [s for s in samples(page) if s.name == "gpu_advisor_forecast_model_info"]
    assert {(s.labels["pool"], s.labels["horizon"], s.labels["model"]) for s in info} == {
        (pool, horizon, h["model"]) for (pool, horizon), h in served.items() if h["available"]
    }
    assert all(s.value == 1.0 for s in info)
    origins = [s for s in samples(page) if s.name == "gpu_advisor_forecast_backtest_origins"]
    assert {(s.labels["pool"], s.labels["horizon"]): s.value for s in origins} == {
        key: h["backtest"]["test_origins"] for key, h in served.items() if h["available"]
    }
    assert all(s.value >= 6 for s in origins)  # MIN_HALF held-back origins at least
    # the coverage's own sample size, per served model: the hours that had an interval
    counted = [
        s for s in samples(page) if s.name == "gpu_advisor_forecast_backtest_coverage_origins"
    ]
    assert {
        (s.labels["pool"], s.labels["horizon"], s.labels["model"]): s.value for s in counted
    } == {
        (*key, model): n
        for key, h in served.items()
        if h["available"]
        for model, n in h["backtest"]["coverage_origins"].items()
    }
    assert counted and all(
        s.value <= served[(s.labels["pool"], s.labels["horizon"])]["backtest"]["test_origins"]
        for s in counted
    )


def test_nodes_without_a_pool_are_labelled_none_everywhere():
    from tests.service.conftest import ScriptedSource

    builder = add_nodes(["n1"], 2, gpu_model="A100", island=2)
    model = builder.build(timestamp=1_700_000_000.0)
    state = AdvisorLoop("snap", ScriptedSource(model), Config()).run_once()
    pools = {
        s.labels["pool"]
        for s in samples(families(state).text())
        if s.name
        in {
            "gpu_advisor_node_fragmented_gpus",
            "gpu_advisor_gpu_state",
            "gpu_advisor_fragmentation_ratio",
        }
    }
    assert pools == {"(none)"}


def test_idle_capacity_counts_a_partly_used_idle_gpu_once():
    """`two_nodes`, with job1 (a/0-3) busy and job2 (half of a/4) and job3 (b/0) idle: free
    capacity 9.5 (a/4's free half among it) + the allocated share of the idle GPUs (0.5 + 1)
    = 11.0, not 9.5 + 2 idle GPUs; with the 4 busy GPUs that is the 15 usable (b/1 is lost)."""
    from advisor.fragmentation import measures
    from advisor.model import MILLI
    from advisor.results import type_table
    from tests.advisor.test_measures import two_nodes
    from tests.service.conftest import ScriptedSource

    util = np.zeros((3, 16), dtype=np.float32)
    util[:, 0:4] = 0.9
    usage = ([0.0, 600.0, 1200.0], util, np.zeros_like(util))
    model = two_nodes().build(timestamp=1200.0, usage=usage)
    state = AdvisorLoop("snap", ScriptedSource(model), Config()).run_once()
    served = {
        s.name: s.value
        for s in samples(families(state).text())
        if s.name in ("gpu_advisor_idle_capacity_gpus", "gpu_advisor_allocated_idle_gpus")
    }
    assert served == {"gpu_advisor_idle_capacity_gpus": 11.0, "gpu_advisor_allocated_idle_gpus": 2}
    (row,) = type_table(model, measures.allocated_idle(model, Config().settings.measures.idle))
    assert row["idle_capacity_gpus"] == 11.0 and row["allocated_idle_gpus"] == 2
    busy = float(model.gpu_milli_allocated[0:4].sum()) / MILLI
    assert row["idle_capacity_gpus"] + busy == int(model.gpu_usable.sum()) == 15


@pytest.mark.parametrize(
    "spec", ["sim:a100-16x8?t=7d", "sim:mixed-h100-a100-v100?t=3d", "sim:nvlink-islands?t=2d"]
)
def test_idle_supply_and_busy_allocations_fit_in_the_fleet(spec):
    """Idle supply (free capacity + the allocated share of idle GPUs) and the allocations on
    busy GPUs never add up to more GPUs than each model has."""
    from advisor.fragmentation import measures
    from advisor.ingest.sources import load_source
    from advisor.model import MILLI
    from advisor.pipeline.stages import analyze_model

    model = load_source(spec)
    settings = Config().settings
    idle = measures.allocated_idle(model, settings.measures.idle)
    assert idle.any()  # a partly or wholly allocated idle GPU is what this is about
    results = analyze_model(model, settings.measures, 0.0)
    gpu_model = model.nodes.gpu_model[model.gpus.node]
    for row in results.gpu_models:
        on = gpu_model == row["gpu_model"]
        busy = float(model.gpu_milli_allocated[on & ~idle].sum()) / MILLI
        idle_held = float(model.gpu_milli_allocated[on & idle].sum()) / MILLI
        assert row["idle_capacity_gpus"] + busy <= row["gpus"] + 1e-9, (spec, row)
        assert row["idle_capacity_gpus"] == pytest.approx(row["free_capacity_gpus"] + idle_held)


def test_action_benefit_of_a_share_is_the_share_it_gives_back():
    """seed-mixed-fleet: two H100 tasks need a MIG 1g slice (1/7 of a GPU) each; one is resized
    in place, switching its GPU to MIG mode, the other moves into an instance there. The switched
    GPU's uncarved slices are no free room: the resize gives back nothing, the move its whole GPU
    (the plan: one whole GPU freed, 32 -> 33), not 1 + 1 nor 6/7 + 6/7."""
    from pathlib import Path

    from advisor.ingest.sources import load_source
    from tests.service.conftest import ScriptedSource

    seed = Path(__file__).resolve().parents[2] / "examples" / "seed-mixed-fleet.json"
    state = AdvisorLoop("snap", ScriptedSource(load_source(str(seed))), Config()).run_once()
    page = samples(families(state, top_actions=50).text())
    info = {s.labels["rank"]: s.labels for s in page if s.name == "gpu_advisor_action_info"}
    benefit = {
        s.labels["rank"]: s.value for s in page if s.name == "gpu_advisor_action_benefit_gpus"
    }
    shares = {rank: labels for rank, labels in info.items() if labels["kind"] == "share"}
    assert len(shares) == 2
    assert all("@MIG 1g." in labels["target"] for labels in shares.values())
    (resized,) = (r for r, lab in shares.items() if lab["source"] == lab["target"].split("@")[0])
    assert benefit[resized] == pytest.approx(0.0)
    assert sum(benefit[r] for r in shares) == pytest.approx(1.0)
    (plan,) = (p for p in state.results.recommendations["plans"] if p["method"] == "share")
    assert plan["gpus_freed"] == 1 and plan["after"]["free_gpus"] == plan["before"]["free_gpus"] + 1
    assert sum(benefit[r] for r in shares) == pytest.approx(plan["gpu_share_freed"])
