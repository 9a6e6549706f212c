"""Actions page: the planner's plans with their cost, a selection's check and before/after,
exports that are the selection (JSON/YAML) and commands that name its pods and nodes."""

from __future__ import annotations

import json

import yaml

from advisor.app import plans
from advisor.fragmentation.measures import Shape
from advisor.ingest.sources import load_source
from advisor.pipeline import Settings
from advisor.pipeline import queries as Q
from advisor.planner.constraints import Policy
from advisor.planner.share import plan_share
from tests.app.conftest import frame_with, metrics, open_app


def consolidation(model, goal: str, exact: bool = False):
    """The page's plan for `goal` (no learned ends at t=0: the planner's fallback)."""
    (plan,) = Q.plan_goals(model, Settings(), {}, [goal], exact)
    return plan


PAGE = "views/actions.py"
SOURCE = "sim:a100-16x8"


def test_default_goal_is_the_next_big_job_and_its_plan_is_shown() -> None:
    model = load_source(SOURCE)
    assert Q.next_big_job(model) == Shape(8, tasks=5)  # 4 whole nodes free in rack-02
    expected = consolidation(model, "job=5x8")
    assert expected.feasible and expected.migrations > 0

    at = open_app(SOURCE, PAGE)
    assert at.text_input(key="actions_goal").value == "job=5x8"
    overview = frame_with(at, "GPU-hours held idle")
    assert overview["goal"].iloc[0] == "job=5x8"
    assert overview["restarts"].iloc[0] == expected.cost.restarts
    shown = metrics(at)
    assert shown["Steps"] == str(len(expected.actions))
    assert shown["Restarts"] == str(expected.cost.restarts)
    assert shown["GPU-hours lost"] == f"{expected.cost.gpu_hours:.2f}"
    steps = frame_with(at, "why")
    assert steps["kind"].tolist() == [a.kind for a in expected.actions]

    compare = frame_with(at, "measure").set_index("measure")
    assert compare.loc["jobs of 5x8 GPU that fit", "before"] == 0
    assert compare.loc["jobs of 5x8 GPU that fit", "after"] >= 1

    exported = json.loads(at.code[0].value)
    assert exported["actions"] == [a.to_dict() for a in expected.actions]
    assert yaml.safe_load(at.code[1].value)["steps"] == list(range(1, len(expected.actions) + 1))
    moved = next(a for a in expected.actions if a.kind == "migrate")
    namespace, pod = moved.alloc.split("/")
    assert f"kubectl -n {namespace} delete pod {pod}" in at.code[2].value
    assert f"scontrol update JobId={moved.job} ReqNodeList={moved.dst.node}" in at.code[3].value


def test_a_step_that_needs_an_earlier_one_fails_the_check() -> None:
    model = load_source(SOURCE)
    plan = consolidation(model, "job=5x8")
    alone = [
        i
        for i in range(1, len(plan.actions) + 1)
        if not Q.replay(model, plan, [i], Policy()).check.ok
    ]
    assert alone, "this plan has a move into GPUs an earlier move frees"
    at = open_app(SOURCE, PAGE)
    steps = next(m for m in at.multiselect if m.key.startswith("actions_steps_"))
    steps.set_value([alone[0]]).run()
    assert not at.exception
    assert any("do not pass the check" in e.value for e in at.error)
    assert not at.code  # nothing to export from a selection that does not check


def test_bad_goal_is_a_message() -> None:
    at = open_app(SOURCE, PAGE)
    at.text_input(key="actions_goal").set_value("job=lots").run()
    assert not at.exception
    assert any("Cannot plan" in e.value for e in at.error)


def test_recommend_kinds_from_a_snapshot() -> None:
    source = "examples/seed-mixed-fleet.json"
    at = open_app(source, PAGE)
    kinds = frame_with(at, "GPU-hours held idle")["kinds"].tolist()
    assert any("share" in k for k in kinds) and any("rebalance" in k for k in kinds)


def test_commands_cover_every_kind() -> None:
    from advisor.planner.actions import Action, GpuSet

    actions = [
        Action("reserve", alloc="goal-1", job="goal", dst=GpuSet("n1", (0, 1))),
        Action("reclaim", alloc="team/idle-pod", job="idle", tenant="team", src=GpuSet("n2", (3,))),
        Action("borrow", job="big", quota=(("lender", "A100", -8.0), ("borrower", "A100", 8.0))),
    ]
    kube = plans.kubectl_commands(actions)
    assert "kubectl taint node n1 gpu-defrag.io/reserved=goal:NoSchedule" in kube
    assert "kubectl -n team delete pod idle-pod" in kube
    assert "-8 GPUs" in kube and "+8 GPUs" in kube
    slurm = plans.slurm_commands(actions)
    assert "ReservationName=gpu-defrag-goal-1" in slurm and "Nodes=n1 TRES=gres/gpu=2" in slurm
    assert "scancel idle" in slurm
    assert "sacctmgr modify account borrower set GrpTRES=gres/gpu=<limit+8>" in slurm


def test_commands_switch_a_gpu_to_mig_mode_before_its_instances() -> None:
    """A share plan that switches a GPU to MIG mode: the commands apply a MIG layout at the
    switching step (mig-parted config and node label; nvidia-smi under Slurm) and ask the
    moved pods for MIG instances."""
    model = load_source("examples/seed-mixed-fleet.json")
    plan = plan_share(model, Policy())
    (switch,) = plan.extra["mig_switches"]
    node, gpu, step = switch["node"], switch["gpu"], switch["step"]
    kube = plans.kubectl_commands(plan.actions)
    at_step = kube.split(f"# step {step}:")[1].split("# step ")[0]
    assert f"kubectl label node {node} --overwrite nvidia.com/mig.config=gpu-defrag-{node}" in (
        at_step
    )
    assert f"#     - devices: [{gpu}]" in at_step and "#       mig-enabled: true" in at_step
    counts = {p: switch["profiles"].count(p) for p in switch["profiles"]}
    layout = ", ".join(f'"{p}": {n}' for p, n in sorted(counts.items()))
    assert f"#       mig-devices: {{{layout}}}" in at_step
    assert kube.count("nvidia.com/mig.config=") == 1  # one switch, one label
    for a in plan.actions:
        assert f"nvidia.com/mig-{a.dst.mig_profile}: 1" in kube
    slurm = plans.slurm_commands(plan.actions)
    profiles = ",".join(sorted(switch["profiles"]))
    switched = slurm.index(
        f"nvidia-smi -i {gpu} -mig 1\nnvidia-smi mig -i {gpu} -cgi {profiles} -C"
    )
    # the GPU is switched once its one job is requeued, before that job is released
    job = plan.actions[step - 1].job
    assert (
        slurm.index(f"scontrol requeue {job}") < switched < slurm.index(f"scontrol release {job}")
    )


def test_after_heatmap_shows_the_held_gpus() -> None:
    model = load_source(SOURCE)
    plan = consolidation(model, "job=5x8")
    outcome = Q.replay(model, plan, range(1, len(plan.actions) + 1), Policy())
    frame = plans.planned_frame(outcome.after)
    held = sum(len(a.dst.gpus) for a in plan.actions if a.kind == "reserve")
    assert (frame["state"] == "reserved").sum() == held == 40
    from advisor.app import figures

    fig = figures.fleet_heatmap(frame)
    assert "reserved (planned)" in fig.data[0].colorbar.ticktext
    assert (
        "reserved (planned)"
        not in figures.fleet_heatmap(plans.planned_frame(model)).data[0].colorbar.ticktext
    )


def test_exact_solver_is_opt_in_and_never_costlier() -> None:
    model = load_source(SOURCE)
    heuristic = consolidation(model, "job=5x8")
    assert heuristic.method == "heuristic"
    at = open_app(SOURCE, PAGE)
    at.checkbox(key="actions_exact").check().run()
    assert not at.exception
    overview = frame_with(at, "GPU-hours held idle")
    assert overview["restarts"].iloc[0] <= heuristic.cost.restarts


def test_slow_recommendation_kinds_are_opt_in_on_large_clusters() -> None:
    assert open_app(SOURCE, PAGE).checkbox(key="actions_others").value
    at = open_app("sim:a100-16x8?nodes=320", PAGE)
    assert not at.checkbox(key="actions_others").value
    assert frame_with(at, "GPU-hours held idle")["goal"].tolist()[0].startswith("job=")


def test_each_plan_says_when_to_act() -> None:
    """The window of every plan that acts (advisor.planner.timing), beside the plans."""
    at = open_app(SOURCE, PAGE)
    when = frame_with(at, "GPU-hours saved by waiting")
    overview = frame_with(at, "GPU-hours held idle")
    assert set(when["goal"]) <= set(overview["goal"]) and len(when) >= 1
    for act, reason in zip(when["act"], when["reason"], strict=True):
        assert act == "now" or act.endswith("UTC")
        assert reason.startswith("act ")


def test_after_a_new_goal_the_plan_selector_shows_its_plans() -> None:
    """The selector's labels are the plans of the goal asked now, not the previous goal's (a
    kept widget kept the old labels over the new plan's steps)."""
    at = open_app(SOURCE, PAGE)
    before = next(s for s in at.selectbox if s.label == "Plan")
    assert "job=5x8" in before.value
    at.text_input(key="actions_goal").set_value("job=6x8").run()
    assert not at.exception
    after = next(s for s in at.selectbox if s.label == "Plan")
    assert after.value.startswith("1. job=6x8") and all("job=5x8" not in o for o in after.options)
    assert frame_with(at, "GPU-hours held idle")["goal"].iloc[0] == "job=6x8"


def test_kubectl_and_slurm_exports_download_with_distinct_names() -> None:
    """Both scripts are `.sh`: their names say the goal and the scheduler (the browser test
    checks the names the page offers)."""
    files = [plans.export_name("job=5x8", kind) for kind in plans.EXPORTS]
    assert files == [
        "gpu-defrag-job-5x8.json",
        "gpu-defrag-job-5x8.yaml",
        "gpu-defrag-job-5x8-kubectl.sh",
        "gpu-defrag-job-5x8-slurm.sh",
    ]
    assert plans.export_name("free-nodes=2", "slurm") == "gpu-defrag-free-nodes-2-slurm.sh"
