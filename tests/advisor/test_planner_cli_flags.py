"""`gpu-defrag plan` refuses a flag that the chosen goal does not read (`GOAL_FLAGS` in
advisor/planner/cli.py), or that the other flags leave unread (`FLAG_NEEDS`), before it reads
the source; and those tables say what the code reads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import pytest

from advisor.cli import build_parser, main
from advisor.planner import cli as plan_cli
from advisor.planner.cli import GOAL_FLAGS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ISLANDS = EXAMPLES / "seed-nvlink-islands.json"  # 2 nodes x 8 GPUs: every plan here is quick
FLEET = EXAMPLES / "seed-mixed-fleet.json"  # every recommendation kind has something to say
MISSING = "/nonexistent/snapshot.json"  # a refused flag is named before the source is read
CONSOLIDATION = ("job", "free-nodes", "forecast")
RECOMMENDATION = ("recommend", "reclaim", "share", "rebalance", "reserve", "borrow")
SCOPED = sorted({flag for flags in GOAL_FLAGS.values() for flag in flags})
EVERY = "job, free-nodes, forecast"
DEMAND_GOALS = "free-nodes, forecast"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """{demand}: one 4-GPU job; {demand3}: one 3-GPU job (a shape the measures do not count
    by default); {history}: hourly arrivals of 3-GPU jobs over 8 days, jobs at even hours only
    and none in the last hour, so the forecast model and quantile change the jobs expected."""
    demand, demand3 = tmp_path / "demand.json", tmp_path / "demand3.json"
    demand.write_text(json.dumps({"4": 1}))
    demand3.write_text(json.dumps({"3": 1}))
    times = pd.date_range("2026-01-01", periods=24 * 8, freq="h")
    values = [(1 + t.day % 2) * (t.hour % 2 == 0) for t in times]
    history = tmp_path / "arrivals.csv"
    pd.DataFrame({"time": times, "series": "3", "value": values}).to_csv(history, index=False)
    return {"{demand}": str(demand), "{demand3}": str(demand3), "{history}": str(history)}


def _fill(args, files: dict[str, str]) -> list[str]:
    return [files.get(a, a) for a in args]


def _plan(capsys, source, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["plan", str(source), *args])
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --------------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    ("flag", "value", "goal", "applies_to"),
    [
        ("--solver", "heuristic", "recommend", EVERY),
        ("--time-limit", "30s", "reclaim", EVERY),
        ("--workers", "4", "share", EVERY),
        ("--exact-max-nodes", "10", "rebalance", EVERY),
        ("--priority", "50", "reserve", EVERY),
        ("--tenant", "team-a", "borrow=rnd:8", EVERY),
        ("--demand", "{demand}", "job=4", DEMAND_GOALS),
        ("--demand-model", "naive", "job=8x8", DEMAND_GOALS),
        ("--demand-quantile", "0.9", "recommend", DEMAND_GOALS),
        # a default value given explicitly is still given
        ("--tenant", "", "recommend", EVERY),
        ("--solver", "best", "reserve=nojob", EVERY),
        ("--demand-quantile", "0.5", "job=4", DEMAND_GOALS),
    ],
)
def test_a_flag_the_goal_does_not_read_is_refused(
    capsys, files, flag, value, goal, applies_to
) -> None:
    code, out, err = _plan(capsys, MISSING, "--goal", goal, flag, files.get(value, value))
    assert code == 2 and not out
    assert err == (
        f"gpu-defrag plan: error: {flag} does not apply to --goal {goal} "
        f"(it applies to: {applies_to})\n"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--goal", "recommend", "--tenant=team-a"],  # --flag=value
        ["--goal", "recommend", "--ten", "team-a"],  # an abbreviation argparse accepts
        ["--goal", " recommend ", "--tenant", "team-a"],
        ["--tenant", "team-a", "--json", "--goal", "recommend"],  # any order
    ],
)
def test_every_spelling_of_a_flag_is_refused(capsys, args) -> None:
    code, out, err = _plan(capsys, MISSING, *args)
    assert code == 2 and not out
    assert err.count("\n") == 1
    assert "error: --tenant does not apply to --goal recommend (it applies to: " in err


def test_the_first_refused_flag_on_the_command_line_is_named(capsys) -> None:
    args = ["--goal", "share", "--json", "--workers", "2", "--tenant", "x", "--priority", "1"]
    code, _, err = _plan(capsys, MISSING, *args)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("gpu-defrag plan: error: --workers does not apply to --goal share ")


def test_an_unknown_goal_keeps_its_own_error(capsys) -> None:
    code, _, err = _plan(capsys, ISLANDS, "--goal", "banana=1", "--tenant", "x")
    assert code == 2 and "unknown goal 'banana'" in err and "does not apply" not in err


# --------------------------------------------------------------------------- accepted


@pytest.mark.parametrize(
    ("source", "args"),
    [
        (ISLANDS, ["--goal", "job=4", "--solver", "heuristic"]),
        (ISLANDS, ["--goal", "free-nodes=1", "--time-limit", "3"]),
        (ISLANDS, ["--goal", "forecast=2h", "--demand", "{demand}", "--workers", "2"]),
        (ISLANDS, ["--goal", "job=4", "--exact-max-nodes", "1"]),
        (ISLANDS, ["--goal", "free-nodes=1", "--priority", "0"]),
        (ISLANDS, ["--goal", "job=4", "--tenant", "team-a"]),
        (ISLANDS, ["--goal", "free-nodes=1", "--demand", "{demand3}"]),
        (ISLANDS, ["--goal", "forecast=2h", "--demand", "{history}", "--demand-model", "naive"]),
        (ISLANDS, ["--goal", "free-nodes=1", "--demand", "{history}", "--demand-quantile", "0.9"]),
        # flags that apply to every goal
        (FLEET, ["--goal", "borrow=rnd:8", "--policy", str(EXAMPLES / "policy-quotas.yaml")]),
        (FLEET, ["--goal", "reclaim", "--json"]),
    ],
)
def test_a_flag_the_goal_reads_is_accepted(capsys, files, source, args) -> None:
    code, out, err = _plan(capsys, source, *_fill(args, files))
    assert code in (0, 1), err
    assert out and "does not apply" not in err


# --------------------------------------------------------------------------- the table


def test_the_table_names_every_goal() -> None:
    from advisor.planner.recommend import GOALS

    assert set(GOAL_FLAGS) == {*CONSOLIDATION, *GOALS}
    assert set(GOALS) == set(RECOMMENDATION)


def test_help_lists_the_goals_of_each_scoped_flag() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.option_strings[-1]: a.help for a in sub.choices["plan"]._actions if a.option_strings}
    for flag in SCOPED:
        assert helps[flag].endswith(f"[goals: {', '.join(plan_cli.goals_reading(flag))}]"), flag
    assert "goals:" not in helps["--policy"] and "goals:" not in helps["--json"]


# Each goal's run: its source and arguments; for each flag, (arguments both runs get,
# arguments that set the flag away from its default).
GOAL_RUN = {
    "job": (ISLANDS, ["--goal", "job=4"]),
    "free-nodes": (ISLANDS, ["--goal", "free-nodes=1"]),
    "forecast": (ISLANDS, ["--goal", "forecast=2h", "--demand", "{demand}"]),
    **{goal: (FLEET, ["--goal", goal]) for goal in RECOMMENDATION},
    "borrow": (FLEET, ["--goal", "borrow=rnd:8"]),
}
PROBE = {
    "--solver": ([], ["--solver", "heuristic"]),  # no exact solver, no comparison
    "--time-limit": ([], ["--time-limit", "3"]),  # what the exact solver gets
    "--workers": ([], ["--workers", "2"]),
    "--exact-max-nodes": ([], ["--exact-max-nodes", "1"]),  # 2 nodes: exact skipped
    "--priority": ([], ["--priority", "-1"]),  # nothing may move
    "--tenant": ([], ["--tenant", "team-a"]),  # the reservations' tenant
    "--demand": ([], ["--demand", "{demand3}"]),  # another shape to hold or measure
    "--demand-model": (["--demand", "{history}"], ["--demand-model", "naive"]),
    "--demand-quantile": (
        ["--demand", "{history}", "--demand-model", "naive"],
        ["--demand-quantile", "0.9"],
    ),
}
TIMING = {"elapsed_s", "solver_s"}


def _without_timing(doc):
    if isinstance(doc, dict):
        return {k: _without_timing(v) for k, v in doc.items() if k not in TIMING}
    if isinstance(doc, list):
        return [_without_timing(v) for v in doc]
    return doc


def _observe(capsys, monkeypatch, source, args: list[str]):
    """What a run shows: exit status, the JSON plan without timings, and what the exact solver
    was asked (time limit and threads do not show in a plan the solver proves optimal fast)."""
    import advisor.planner.exact as exact

    calls: list[tuple] = []
    real = getattr(exact.plan_exact, "real", exact.plan_exact)  # not an earlier run's spy

    def spy(*a, **kw):
        calls.append((kw.get("time_limit_s"), kw.get("workers")))
        return real(*a, **kw)

    spy.real = real  # type: ignore[attr-defined]
    monkeypatch.setattr(exact, "plan_exact", spy)
    code, out, err = _plan(capsys, source, *args, "--json")
    assert "does not apply" not in err
    return code, _without_timing(json.loads(out)) if out else err, tuple(calls)


@pytest.mark.parametrize(
    ("goal", "flag"), [(goal, flag) for goal in GOAL_FLAGS for flag in GOAL_FLAGS[goal]]
)
def test_every_flag_the_table_claims_changes_the_goals_result(
    capsys, monkeypatch, files, goal, flag
) -> None:
    source, args = GOAL_RUN[goal]
    common, probe = PROBE[flag]
    base = _fill([*args, *common], files)
    without = _observe(capsys, monkeypatch, source, base)
    with_flag = _observe(capsys, monkeypatch, source, [*base, *_fill(probe, files)])
    assert with_flag != without, f"{goal} ignores {flag}"


@pytest.mark.parametrize("goal", [g for g in GOAL_FLAGS if set(SCOPED) - set(GOAL_FLAGS[g])])
def test_the_flags_a_goal_is_refused_do_not_change_its_result(
    capsys, monkeypatch, files, goal
) -> None:
    """Let the goal take every flag its row lacks, each set away from its default (a demand
    history, so the forecaster's flags have one to read): the result is the one without them,
    so refusing them takes nothing from the goal."""
    source, args = GOAL_RUN[goal]
    ignored = [flag for flag in SCOPED if flag not in GOAL_FLAGS[goal]]
    probes = {**{f: PROBE[f][1] for f in ignored}, "--demand": ["--demand", "{history}"]}
    extra = [a for flag in ignored for a in probes[flag]]
    monkeypatch.setitem(GOAL_FLAGS, goal, tuple(SCOPED))  # nothing refused
    monkeypatch.setattr(plan_cli, "FLAG_NEEDS", {})
    without = _observe(capsys, monkeypatch, source, _fill(args, files))
    with_flags = _observe(capsys, monkeypatch, source, _fill([*args, *extra], files))
    assert with_flags == without


class _Reads(argparse.Namespace):
    """A namespace that notes every attribute read."""

    def __getattribute__(self, name: str):
        if not name.startswith("_"):
            object.__getattribute__(self, "__dict__").setdefault("_read", set()).add(name)
        return object.__getattribute__(self, name)


@pytest.mark.parametrize("goal", RECOMMENDATION)
def test_recommendation_goals_read_no_scoped_flag(capsys, goal) -> None:
    """The recommendation kinds read `args` for the source, goal, policy and JSON only: the
    table's empty rows cannot hide a flag one of them starts to read."""
    text = "borrow=rnd:8" if goal == "borrow" else goal
    args = build_parser().parse_args(["plan", str(FLEET), "--goal", text], namespace=_Reads())
    args.__dict__["_read"] = set()
    assert args.func(args) in (0, 1)
    capsys.readouterr()
    dests = {flag.removeprefix("--").replace("-", "_") for flag in SCOPED}
    assert not dests & args.__dict__["_read"]
    assert {"goal", "source", "policy", "json"} <= args.__dict__["_read"]


# --------------------------------------------------------------------------- flags that need others

# (goal's arguments, the flag's arguments, the line): the flag's condition in FLAG_NEEDS is false
UNREAD = [
    (
        ["--goal", "job=4", "--solver", "heuristic"],
        ["--time-limit", "3"],
        "with --solver heuristic",
    ),
    (["--goal", "job=4", "--solver", "heuristic"], ["--workers", "2"], "with --solver heuristic"),
    (
        ["--goal", "job=4", "--solver", "exact"],
        ["--exact-max-nodes", "1"],
        "unless --solver is best (it caps the nodes best gives the exact solver)",
    ),
    (
        ["--goal", "free-nodes=1", "--solver", "heuristic"],
        ["--exact-max-nodes", "1"],
        "unless --solver is best (it caps the nodes best gives the exact solver)",
    ),
    (
        ["--goal", "forecast=2h", "--demand", "{demand3}"],
        ["--demand-model", "naive"],
        "unless --demand is an arrival history (CSV/Parquet) to forecast",
    ),
    (
        ["--goal", "free-nodes=1"],
        ["--demand-quantile", "0.9"],
        "unless --demand is an arrival history (CSV/Parquet) to forecast",
    ),
]


@pytest.mark.parametrize(("args", "flag_args", "why"), UNREAD)
def test_a_flag_the_other_flags_leave_unread_is_refused(capsys, files, args, flag_args, why):
    code, out, err = _plan(capsys, MISSING, *_fill([*args, *flag_args], files))
    assert code == 2 and not out
    assert err == f"gpu-defrag plan: error: {flag_args[0]} is not read {why}\n"


@pytest.mark.parametrize(("args", "flag_args", "why"), UNREAD)
def test_a_flag_refused_for_the_other_flags_does_not_change_the_result(
    capsys, monkeypatch, files, args, flag_args, why
) -> None:
    """The table's other side: let the flag through, and the plan is the one without it."""
    monkeypatch.setattr(plan_cli, "FLAG_NEEDS", {})
    without = _observe(capsys, monkeypatch, ISLANDS, _fill(args, files))
    with_flag = _observe(capsys, monkeypatch, ISLANDS, _fill([*args, *flag_args], files))
    assert with_flag == without


def test_every_flag_with_a_condition_is_scoped() -> None:
    assert set(plan_cli.FLAG_NEEDS) <= set(SCOPED)
