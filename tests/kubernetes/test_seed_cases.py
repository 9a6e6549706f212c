"""The seed cases of examples/ read back from a live Kubernetes API (objects made from the seed
snapshots, served by the fake API server, read with the real client) give the same answer as
the snapshots themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from advisor import scheduler_report, snapshot
from advisor.ingest.kubernetes.manifests import objects_from_model
from advisor.ingest.sources import load_source
from advisor.planner.borrow import plan_borrow, request_for_job
from advisor.planner.cli import solve
from advisor.planner.consolidate import parse_goal
from advisor.planner.constraints import Policy, load_policy, policy_from_dict
from advisor.planner.policy_merge import merge_lines, merged_policy
from tests.fakes.page_server import Routes, serve
from tests.kubernetes.pages import exporter_page, readings_from_model
from tests.kubernetes.seeds import seed_16x8

EXAMPLES = Path(__file__).parents[2] / "examples"


def short(name: str) -> str:
    """A job or task id without its namespace (the snapshot's ids have none)."""
    return str(name).rpartition("/")[2]


def moves(plan) -> list[tuple]:
    return sorted(
        (
            a.kind,
            short(a.job),
            a.src.node if a.src else None,
            a.dst.node if a.dst else None,
        )
        for a in plan.actions
    )


@pytest.fixture
def seed_16x8_served(kube):
    seed, objects = seed_16x8()
    return seed, objects, kube(objects)


def test_16x8_pending_gang_plan_matches_the_snapshot(seed_16x8_served):
    seed, _, _ = seed_16x8_served
    live = load_source("k8s:")
    queue = scheduler_report.pending_jobs(live)
    assert [(r["job"], r["shape"], r["gang_size"]) for r in queue] == [("rnd/pretrain", "8x8", 8)]
    expected = solve(seed, parse_goal("job=8x8"), Policy(), time_limit_s=30)
    got = solve(live, parse_goal("job=8x8"), Policy(), time_limit_s=30)
    assert expected.feasible and got.feasible
    assert got.migrations == expected.migrations == 6
    freed = {a.dst.node for a in got.actions if a.kind == "reserve"}
    assert freed == {a.dst.node for a in expected.actions if a.kind == "reserve"}
    assert len({str(live.nodes.rack[live.node_index(n)]) for n in freed}) == 1  # one rack
    # at the pending gang's own priority nothing above it moves, nor any non-migratable pod
    job_plan = solve(
        live, parse_goal(f"job={queue[0]['shape']}", priority=500), Policy(), time_limit_s=30
    )
    allocs = live.allocations
    moved = {a.alloc for a in job_plan.actions if a.kind == "migrate"}
    for alloc in moved:
        row = allocs.id.tolist().index(alloc)
        assert allocs.migratable[row] and allocs.priority[row] <= 500


def test_16x8_with_exporters_is_the_snapshots_plan_exactly(seed_16x8_served):
    seed, _, _ = seed_16x8_served
    routes = Routes()
    routes.text("/metrics", exporter_page(readings_from_model(seed)))
    with serve(routes) as url:
        live = load_source(f"k8s:+{url}/metrics")
    assert live.scheduler.notes == ()  # every node and pod joins
    expected = solve(seed, parse_goal("job=8x8"), Policy(), time_limit_s=30)
    got = solve(live, parse_goal("job=8x8"), Policy(), time_limit_s=30)
    assert moves(got) == moves(expected)
    assert [(a.src, a.dst) for a in got.actions] == [(a.src, a.dst) for a in expected.actions]


def borrow_answer(model, policy, job):
    plan = plan_borrow(model, policy, request_for_job(model, job))
    loans = sorted(
        (tuple(q for q in a.quota if q[2] > 0), tuple(q for q in a.quota if q[2] < 0))
        for a in plan.actions
        if a.kind == "borrow"
    )
    placed = sorted(a.dst.node for a in plan.actions if a.kind == "reserve")
    return plan.feasible, loans, placed


@pytest.mark.parametrize("quotas_as", ["resourcequota", "kueue"])
def test_borrowing_with_scheduler_quotas_matches_the_snapshot(kube, quotas_as):
    seed = snapshot.load(EXAMPLES / "seed-quota-borrow.json")
    file_policy = load_policy(EXAMPLES / "policy-borrow.yaml")
    kube(objects_from_model(seed, policy=file_policy, quotas_as=quotas_as))
    live = load_source("k8s:")
    quotas = {q.tenant: q.gpus for q in live.scheduler.quotas}
    assert quotas == {"rnd": 40, "algorithms": 30, "product": 20}
    # the quotas come from the scheduler, the loan rules from a file without quotas
    rules_only = policy_from_dict(
        {
            "borrowing": {
                "max_borrow_ratio": 0.75,
                "priority_threshold": 50,
                "auto_return_s": 172800,
                "grace_s": 900,
                "preemption": True,
            }
        }
    )
    policy = merged_policy(rules_only, live)
    expected = borrow_answer(seed, file_policy, "rnd-pretrain")
    got = borrow_answer(live, policy, "rnd/rnd-pretrain")
    assert got == expected
    assert got[0] and len(got[2]) == 4
    lines = merge_lines(rules_only, live, "rules.yaml")
    origin = "ResourceQuota rnd/gpu" if quotas_as == "resourcequota" else "ClusterQueue rnd"
    assert any(line.startswith(f"  rnd: 40 GPUs on all models - {origin}") for line in lines)


def test_kueue_alone_lends_only_within_its_cohort(kube):
    """Without a file, Kueue's own rules apply: the cohort lends what its members do not use,
    and capacity no ClusterQueue covers is not Kueue's to lend."""
    seed = snapshot.load(EXAMPLES / "seed-quota-borrow.json")
    # Kueue's borrowing is per ClusterQueue, so the seed's quotas go in with per-tenant rules
    per_tenant = load_policy(EXAMPLES / "policy-borrow-per-tenant.yaml")
    kube(objects_from_model(seed, policy=per_tenant, quotas_as="kueue"))
    live = load_source("k8s:")
    plan = plan_borrow(live, merged_policy(None, live), request_for_job(live, "rnd/rnd-pretrain"))
    assert not plan.feasible
    assert "lenders have only 15 unused GPUs" in plan.reason


def test_nvlink_islands_from_the_exporter_joined_to_pods(kube):
    seed = snapshot.load(EXAMPLES / "seed-nvlink-islands.json")
    kube(objects_from_model(seed))
    routes = Routes()
    routes.text("/metrics", exporter_page(readings_from_model(seed)))
    with serve(routes) as url:
        live = load_source(f"k8s:+{url}/metrics")
    assert (live.gpus.nvlink_island >= 0).all()
    expected = solve(seed, parse_goal("job=4"), Policy(), time_limit_s=30)
    got = solve(live, parse_goal("job=4"), Policy(), time_limit_s=30)
    assert got.feasible and got.migrations == expected.migrations == 1
    assert [(a.kind, a.src, a.dst) for a in got.actions] == [
        (a.kind, a.src, a.dst) for a in expected.actions
    ]
