"""An action's benefit is what it frees, and a plan's actions add up to the plan's benefit.

docs/service.md: a consolidation plan's actions add up to the job's GPUs (a migration counts the
GPU share it frees that the plan reserves, a reservation the share of its GPUs that was free
already); a reservation or loan plan's to the GPUs it holds now (a loan counts none); a reclaim,
share or rebalance counts the GPU share it gives back (old share - new share: a task resized in
place gives back what it no longer holds, a rebalance the scarce GPUs it leaves). The expected
plan benefit is measured on the model, by replaying the plan, not read off the actions.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from advisor.fragmentation.measures import parse_shape
from advisor.ingest.live import LiveSim
from advisor.ingest.sources import load_source
from advisor.model import MILLI, ClusterModel
from advisor.pipeline import RunState
from advisor.planner.actions import KINDS, Action, Plan
from advisor.planner.check import apply_plan
from advisor.planner.consolidate import parse_goal, plan_heuristic
from advisor.planner.constraints import Policy, load_policy
from advisor.planner.ranking import ranked_actions
from advisor.planner.recommend import recommend
from advisor.service.loop import AdvisorLoop, Config
from advisor.settings import Settings
from tests.advisor._recommend_clusters import clusters, policies
from tests.advisor.test_planner_reclaim import model as reclaim_model
from tests.conftest import GIB, add_nodes
from tests.service.conftest import ScriptedSource

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SEEDS = sorted(p.stem for p in EXAMPLES.glob("*.json") if p.stem.startswith(("seed-", "sim-")))
PRESETS = ("sim:a100-16x8?nodes=8", "sim:mixed-h100-a100-v100", "sim:nvlink-islands")


def halves_on_one_gpu() -> ClusterModel:
    """Node a: two half-GPU tasks on GPU 0, the rest free; node b: a pinned whole-GPU task on
    GPU 0. An 8-GPU job needs both halves moved off a/0: each frees half of it."""
    b = add_nodes(["a", "b"], rack="r1", gpu_model="A100", memory_total_bytes=80 * GIB)
    b.add_allocation("x", num_gpu=1, gpu_milli=500, node="a", gpus=[0], tenant="t")
    b.add_allocation("y", num_gpu=1, gpu_milli=500, node="a", gpus=[0], tenant="t")
    b.add_allocation("pinned", num_gpu=1, node="b", gpus=[0], tenant="t", migratable=False)
    return b.build(timestamp=1_000_000.0)


def _snapshot(name: str) -> RunState:
    model = load_source(str(EXAMPLES / f"{name}.json"))
    policy = load_policy(str(EXAMPLES / "policy-borrow.yaml")) if "quota" in name else Policy()
    return AdvisorLoop(
        "snap", ScriptedSource(model), Config(settings=Settings(policy=policy))
    ).run_once()


def _preset(spec: str) -> RunState:
    source = LiveSim(spec, clock=lambda: 0.0)
    loop = AdvisorLoop(spec, source, Config(settings=Settings(horizons_h=(1,))))
    loop.seed_history(source.backfill(24 * 3600.0))  # usage history: share, rebalance
    return loop.run_once()


def _model(model: ClusterModel) -> RunState:
    return AdvisorLoop("snap", ScriptedSource(model), Config()).run_once()


CASES = {
    **{name: (_snapshot, name) for name in SEEDS},
    **{spec: (_preset, spec) for spec in PRESETS},
    "idle allocations": (_model, reclaim_model()),
    "two halves on one GPU": (_model, halves_on_one_gpu()),
}


@pytest.fixture(scope="module")
def states() -> dict[str, RunState]:
    return {name: run(arg) for name, (run, arg) in CASES.items()}


def plan_benefit(model: ClusterModel, plan: dict) -> float:
    """What the plan makes usable, measured by replaying it on the model."""
    if plan["goal"].startswith("job="):  # consolidation: the job it lets start
        return float(parse_shape(plan["goal"].removeprefix("job=")).gpus)
    after = apply_plan(model, [Action.from_dict(a) for a in plan["actions"]])
    delta = (after.gpu_free_milli.astype(np.int64) - model.gpu_free_milli) / MILLI
    if plan["method"] in ("reserve", "borrow"):  # the GPUs it holds now for the job
        return float(-delta[delta < 0].sum())
    # reclaim, share, rebalance: the GPU share given back where the plan frees some
    return float(delta[delta > 0].sum())


def _by_plan(recs: dict) -> list[tuple[dict, list[dict]]]:
    """Each feasible plan with its ranked actions (ranked_actions keeps plan order)."""
    plans = sorted((p for p in recs["plans"] if p["feasible"]), key=_score)
    out, at = [], 0
    for plan in plans:
        out.append((plan, recs["actions"][at : at + len(plan["actions"])]))
        at += len(plan["actions"])
    assert at == len(recs["actions"])
    return out


def _score(plan: dict) -> float:
    return Plan(
        plan["goal"], True, tuple(Action.from_dict(a) for a in plan["actions"])
    ).cost.score()


@pytest.mark.parametrize("case", list(CASES))
def test_actions_of_every_plan_sum_to_what_the_plan_frees(states, case) -> None:
    state = states[case]
    model, recs = state.results.model, state.results.recommendations
    for plan, rows in _by_plan(recs):
        assert [r["kind"] for r in rows] == [a["kind"] for a in plan["actions"]]
        assert all(r["benefit_gpus"] >= 0 for r in rows), rows
        total = sum(r["benefit_gpus"] for r in rows)
        assert total == pytest.approx(plan_benefit(model, plan), abs=1e-9), (
            case,
            plan["goal"],
            [(r["kind"], r["source"], r["target"], r["benefit_gpus"]) for r in rows],
        )
        if plan["method"] == "rebalance":
            assert total == pytest.approx(sum(plan["freed_gpus"].values()))
        if plan["method"] == "share":  # whole GPUs freed, plus the room left on shared ones
            assert total == pytest.approx(plan["gpu_share_freed"])
            # (shares such as 0.6 + 0.7 + 0.7 sum to 1.9999999999999998 in floats)
            assert (
                plan["gpus_freed"] - 1e-9 <= total < plan["gpus_freed"] + len(plan["shared_gpus"])
            )


def test_the_cases_cover_every_action_kind(states) -> None:
    kinds = Counter(
        a["kind"] for s in states.values() for a in s.results.recommendations["actions"]
    )
    assert set(kinds) == set(KINDS)


def test_a_share_counts_the_share_it_gives_back(states) -> None:
    """seed-mixed-fleet: two H100 tasks need a MIG 1g slice (1/7) each; one is resized in
    place, which switches its GPU to MIG mode, the other moves into an instance there. The
    switched GPU's uncarved slices are no free room, so the resize gives back nothing and the
    move its whole GPU: 1 in all (the one whole GPU freed), not 12/7 nor 1 + 1."""
    recs = states["seed-mixed-fleet"].results.recommendations
    shares = [a for a in recs["actions"] if a["kind"] == "share"]
    assert len(shares) == 2
    assert all("@MIG 1g." in row["target"] for row in shares)
    (resized,) = (r for r in shares if r["source"] == r["target"].partition("@")[0])
    (moved,) = (r for r in shares if r is not resized)
    assert resized["benefit_gpus"] == 0.0 and moved["benefit_gpus"] == 1.0
    (plan,) = (p for p in recs["plans"] if p["method"] == "share")
    assert plan["gpu_share_freed"] == pytest.approx(1.0) and plan["gpus_freed"] == 1


def test_two_tasks_leaving_one_reserved_gpu_count_half_each(states) -> None:
    recs = states["two halves on one GPU"].results.recommendations
    rows = [a for a in recs["actions"] if a["goal"] == "job=8"]
    moves = {a["alloc"]: a["benefit_gpus"] for a in rows if a["kind"] == "migrate"}
    assert moves == {"x": 0.5, "y": 0.5}
    (reserve,) = (a for a in rows if a["kind"] == "reserve")
    assert reserve["benefit_gpus"] == 7.0  # a/1-7 were free; a/0 is counted by the moves
    assert sum(a["benefit_gpus"] for a in rows) == 8.0


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(m=clusters(), policy=policies())
def test_random_clusters_every_kind_adds_up(m, policy) -> None:
    plans = recommend(m, policy) + [
        plan_heuristic(m, parse_goal(goal), policy) for goal in ("job=8", "job=4", "job=2x4")
    ]
    for plan in plans:
        if not plan.feasible or not plan.actions:
            continue
        doc = plan.to_dict()
        rows = ranked_actions([plan], m)
        total = sum(r["benefit_gpus"] for r in rows)
        assert total == pytest.approx(plan_benefit(m, doc), abs=1e-9), (
            plan.goal,
            [(r["kind"], r["source"], r["target"], r["benefit_gpus"]) for r in rows],
        )
