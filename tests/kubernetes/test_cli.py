"""`analyze` and `plan` on a k8s: source show the queue and the quotas they used, merged with
`--policy` (the file wins), one line each with its origin."""

from __future__ import annotations

import json

from advisor import snapshot
from advisor.cli import main
from advisor.ingest.kubernetes.manifests import objects_from_model
from advisor.planner.constraints import load_policy
from tests.kubernetes.seeds import EXAMPLES, seed_16x8


def test_analyze_shows_the_queue_racks_and_merged_quotas(kube, tmp_path, capsys):
    seed = snapshot.load(EXAMPLES / "seed-quota-borrow.json")
    kube(objects_from_model(seed, policy=load_policy(EXAMPLES / "policy-borrow.yaml")))
    policy = tmp_path / "team.yaml"
    policy.write_text("quotas:\n  rnd: 48\n")
    assert main(["analyze", "k8s:", "--policy", str(policy), "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert "Scheduler (kubernetes)" in out
    assert "racks: node label topology.kubernetes.io/rack" in out
    assert "queue: 1 job(s) waiting for 32 GPUs" in out
    assert f"Quotas (kubernetes + {policy}; the file wins where both name one)" in out
    assert "  rnd: 48 GPUs on all models - --policy (replaces ResourceQuota rnd/gpu: 40)" in out
    assert "  product: 20 GPUs on all models - ResourceQuota product/gpu" in out
    assert main(["analyze", "k8s:", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scheduler"]["kind"] == "kubernetes"
    assert doc["scheduler"]["pending_jobs"][0]["job"] == "rnd/rnd-pretrain"
    assert doc["cluster"]["racks_from"] == "node label topology.kubernetes.io/rack"


def test_plan_prints_the_quotas_it_used(kube, capsys):
    seed = snapshot.load(EXAMPLES / "seed-quota-borrow.json")
    kube(objects_from_model(seed, policy=load_policy(EXAMPLES / "policy-borrow.yaml")))
    code = main(["plan", "k8s:", "--goal", "job=4x8", "--tenant", "rnd"])
    out = capsys.readouterr().out
    assert code == 1 and "above its quota of 40" in out  # the scheduler's quota applies
    assert "rnd: 40 GPUs on all models - ResourceQuota rnd/gpu" in out
    assert main(["plan", "k8s:", "--goal", "job=4x8", "--tenant", "rnd", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert any("ResourceQuota rnd/gpu" in line for line in doc["quotas"])


def test_plan_job_8x8_from_the_live_seed(kube, capsys):
    _, objects = seed_16x8()
    kube(objects)
    assert main(["plan", "k8s:", "--goal", "job=8x8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["feasible"] and sum(a["kind"] == "migrate" for a in doc["actions"]) == 6
