"""Scheduler quotas under a --policy file: the file wins, and the merge is shown."""

from __future__ import annotations

import dataclasses

from advisor.model import ModelBuilder
from advisor.planner.constraints import ANY_MODEL, Policy, policy_from_dict
from advisor.planner.policy_merge import merge_lines, merged_policy
from advisor.scheduler_view import Quota, SchedulerFacts


def model_with(quotas):
    b = ModelBuilder()
    b.add_node("n")
    b.add_gpu("n", 0)
    return dataclasses.replace(
        b.build(), scheduler=SchedulerFacts("kubernetes", quotas=tuple(quotas)), _cache={}
    )


QUOTAS = (
    Quota("rnd", 40, origin="ClusterQueue rnd", cohort="all", borrows=True, borrowing_limit=20),
    Quota("algo", 30, origin="ClusterQueue algo", cohort="all", borrows=True, lending_limit=10),
    Quota("prod", 20, origin="ResourceQuota prod/gpu"),
    Quota("prod", 25, origin="ResourceQuota prod/other"),  # the API server enforces both
)


def test_scheduler_quotas_alone():
    policy = merged_policy(None, model_with(QUOTAS))
    assert policy.quotas == {
        ("rnd", ANY_MODEL): 40,
        ("algo", ANY_MODEL): 30,
        ("prod", ANY_MODEL): 20,
    }
    rnd = policy.borrow_rules("rnd")
    assert rnd.cohort == "all" and rnd.max_borrow_ratio == 0.5
    assert policy.borrow_rules("algo").max_lend_gpus == 10
    assert (
        policy.borrow_rules("prod").max_borrow_ratio == 0 and not policy.borrow_rules("prod").lend
    )


def test_file_wins_and_the_merge_says_so():
    file_policy = policy_from_dict({"quotas": {"rnd": 48}})
    policy = merged_policy(file_policy, model_with(QUOTAS))
    assert policy.quotas[("rnd", ANY_MODEL)] == 48
    assert policy.quotas[("algo", ANY_MODEL)] == 30
    lines = merge_lines(file_policy, model_with(QUOTAS), "team.yaml")
    assert lines[0].startswith("Quotas (kubernetes + team.yaml; the file wins")
    assert "  rnd: 48 GPUs on all models - --policy (replaces ClusterQueue rnd: 40)" in lines
    assert "  prod: 20 GPUs on all models - ResourceQuota prod/gpu" in lines


def test_file_borrowing_replaces_the_schedulers():
    file_policy = policy_from_dict({"borrowing": {"max_borrow_ratio": 0.25}})
    policy = merged_policy(file_policy, model_with(QUOTAS))
    assert policy.borrow_rules("rnd").max_borrow_ratio == 0.25
    assert policy.borrow_rules("rnd").cohort == ""


def test_no_scheduler_no_change():
    policy = Policy(quotas={("a", ANY_MODEL): 1.0})
    b = ModelBuilder()
    assert merged_policy(policy, b.build()) is policy
    assert merge_lines(None, b.build()) == []


def test_policy_file_takes_cohort_and_lend_limit():
    policy = policy_from_dict(
        {"borrowing": {"tenants": {"a": {"cohort": "x", "max_lend_gpus": 4}}}}
    )
    assert policy.borrow_rules("a").cohort == "x" and policy.borrow_rules("a").max_lend_gpus == 4
