"""`gpu-defrag plan --goal recommend` with nothing to recommend says so, and why, per kind."""

from __future__ import annotations

from advisor.cli import main

SIM = "sim:a100-16x8?t=7d"  # one instant: no usage history, no waiting job, no quotas


def test_nothing_to_recommend_is_one_line_with_each_kinds_reason(capsys) -> None:
    assert main(["plan", SIM, "--goal", "recommend"]) == 0
    out = capsys.readouterr().out.strip()
    assert "\n" not in out and out.startswith("nothing to recommend: reserve: ")
    for kind in ("borrow", "reclaim", "share", "rebalance"):
        assert f"; {kind}: " in out
    assert "reclaim: the source has no usage history" in out
    assert "share: the source has no usage history" in out
    assert out.count("with usage history (") == 1  # how to read history, said once
    # a sim: source's past starts at t=0: the hint says t must reach back as far as the history
    assert "on a sim: source also t at least the history" in out
    assert "sim:a100-16x8?t=2d&history=24h" in out
    assert main(["plan", SIM, "--goal", "recommend", "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"


def test_reclaim_without_history_names_the_missing_history(capsys) -> None:
    assert main(["plan", SIM, "--goal", "reclaim"]) == 0
    out = capsys.readouterr().out
    assert "note: the source has no usage history" in out and "history=24h" in out
    assert "t=2d&history=24h" in out
    assert "idle long enough" not in out


def test_the_header_names_the_method_and_goal_priority_only_where_there_is_one(capsys) -> None:
    """`--goal reserve` with nothing to hold printed `method:    feasible: True` and `goal
    priority: None`: the recommendation kinds name their method and have no goal priority;
    the consolidation goals keep theirs."""
    from advisor.ingest.sources import load_source

    running = str(load_source(SIM).allocations.job[0])  # needs no reservation: it runs
    for goal in ("reserve", f"reserve={running}", "reclaim", "share", "rebalance"):
        main(["plan", SIM, "--goal", goal])
        out = capsys.readouterr().out
        method = goal.partition("=")[0]
        assert f"   method: {method}   feasible: " in out.splitlines()[0], out
        assert "goal priority" not in out
    main(["plan", SIM, "--goal", "free-nodes=1"])
    out = capsys.readouterr().out
    assert "   method: heuristic   " in out.splitlines()[0]
    assert "\ngoal priority: " in out and "None" not in out


def test_notes_name_only_the_kinds_without_a_plan() -> None:
    from pathlib import Path

    from advisor.ingest.sources import load_source
    from advisor.planner.recommend import recommend, recommend_with_notes

    seed = Path(__file__).resolve().parents[2] / "examples" / "seed-mixed-fleet.json"
    model = load_source(str(seed))
    plans, notes = recommend_with_notes(model)
    assert [p.to_dict() for p in plans] == [p.to_dict() for p in recommend(model)]
    assert {p.method for p in plans} == {"reserve", "share", "rebalance"}
    assert [n.partition(":")[0] for n in notes] == ["borrow", "reclaim"]


def test_rebalance_and_reserve_say_the_reason_that_holds(capsys) -> None:
    """One GPU model, no waiting job: nothing is scarce (not "no light job fits"), and no job of
    the size reservations are made for waits (not "every waiting job fits")."""
    assert main(["plan", SIM, "--goal", "rebalance"]) == 0
    assert "no GPU model is scarce" in capsys.readouterr().out
    assert main(["plan", SIM, "--goal", "reserve"]) == 0
    out = capsys.readouterr().out
    assert "no waiting job of 8+ GPUs needs a hold" in out and "every waiting job" not in out
