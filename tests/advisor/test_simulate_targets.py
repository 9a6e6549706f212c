"""The replay's targets as the tool checks them: ratios and verdicts against the advisor off on
hand-made summary rows, unknown where nothing can be judged, medians over seeds."""

from __future__ import annotations

import math
from typing import Any

from advisor.simulate.targets import POOLED, TARGET_COLUMNS, target_rows, verdict_line


def row(advisor: str, p90: float, waiting: float, seed: int = 42, **kw: Any) -> dict[str, Any]:
    return {
        "policy": kw.get("policy", "leastallocated"),
        "advisor": advisor,
        "seed": seed,
        "wait_p90_s_big": p90,
        "wait_gpu_hours": waiting,
        "moved_pct_per_day": kw.get("moved", 0.5),
        "restart_gpu_hours": kw.get("restart", 1.0),
        "held_gpu_hours": kw.get("held", 0.0),
    }


def by_mode(rows: list[dict[str, Any]]) -> dict[tuple[str, Any], dict[str, Any]]:
    return {(r["advisor"], r["seed"]): r for r in rows}


def test_a_mode_is_judged_against_the_same_scheduler_and_seed_with_the_advisor_off() -> None:
    rows = target_rows(
        [
            row("off", 1000.0, 500.0),
            row("on", 400.0, 300.0, moved=0.8, restart=10.0, held=30.0),
            row("consolidate", 600.0, 450.0, moved=0.9),
            row("off", 10.0, 1.0, policy="mostallocated"),  # another scheduler's: not used
        ],
        budget_pct=1.0,
    )
    got = by_mode(rows)
    on = got[("on", 42)]
    assert set(on) == set(TARGET_COLUMNS)
    assert on["vs_off"] == 0.4 and on["wait_p90_s_big_off"] == 1000.0
    assert on["saved_gpu_hours"] == 200.0 and on["cost_gpu_hours"] == 40.0
    assert on["halved"] and on["within_budget"] and on["cost_below_saved"] and on["met"]
    assert on["better_than"] == "consolidate"
    kai = got[("consolidate", 42)]
    assert kai["vs_off"] == 0.6 and not kai["halved"] and kai["met"] is False
    assert kai["better_than"] == ""
    assert len(rows) == 2  # off rows are the baseline, not judged


def test_moving_more_than_the_budget_misses_and_beats_nobody() -> None:
    rows = by_mode(
        target_rows(
            [
                row("off", 1000.0, 500.0),
                row("on", 100.0, 50.0, moved=1.5),
                row("descheduler", 900.0, 490.0),
            ],
            budget_pct=1.0,
        )
    )
    on = rows[("on", 42)]
    assert on["halved"] and not on["within_budget"] and on["met"] is False
    assert on["better_than"] == ""
    assert "missed" in verdict_line(on, 1.0)


def test_nothing_to_halve_or_no_baseline_is_unknown_not_a_pass() -> None:
    rows = by_mode(
        target_rows(
            [
                row("off", 0.0, 0.0),  # no big job waited with the advisor off
                row("on", 0.0, 0.0, restart=0.0),
                row("on", 50.0, 10.0, seed=7),  # seed 7 has no off row
            ],
            budget_pct=1.0,
        )
    )
    nothing = rows[("on", 42)]
    assert math.isnan(nothing["vs_off"]) and nothing["halved"] is None and nothing["met"] is None
    assert "nothing to halve" in verdict_line(nothing, 1.0)
    assert "targets unknown" in verdict_line(nothing, 1.0)
    alone = rows[("on", 7)]
    assert math.isnan(alone["saved_gpu_hours"]) and alone["cost_below_saved"] is None
    assert alone["met"] is None
    assert "no advisor-off replay of this scheduler and seed" in verdict_line(alone, 1.0)


def test_several_seeds_add_a_median_row_counting_the_seeds_that_met_all_three() -> None:
    summary = []
    for seed, (off, on) in enumerate([(1000.0, 400.0), (1000.0, 600.0), (800.0, 360.0)]):
        summary += [row("off", off, 500.0, seed), row("on", on, 300.0, seed, moved=0.9)]
    rows = target_rows(summary, budget_pct=1.0)
    pooled = by_mode(rows)[("on", POOLED)]
    assert [r["seed"] for r in rows] == [0, 1, 2, POOLED]
    assert pooled["seeds"] == 3 and pooled["vs_off"] == 0.45  # ratios 0.4, 0.6, 0.45
    assert pooled["halved"] and pooled["met"] and pooled["met_seeds"] == 2
    assert "all three on 2 of 3 seeds" in verdict_line(pooled, 1.0)


def test_a_finished_summary_csv_is_checked_the_same_way() -> None:
    """Rows read back from summary.csv: text, and an unknown figure an empty cell."""
    rows = [row("off", 1000.0, 500.0), row("on", 400.0, 300.0), row("descheduler", 0.0, 0.0)]
    rows[2]["wait_p90_s_big"] = ""  # no big job started with it
    as_text = [{k: str(v) for k, v in r.items()} for r in rows]
    got = by_mode(target_rows(as_text, budget_pct=1.0))
    assert got[("on", "42")]["vs_off"] == 0.4 and got[("on", "42")]["met"]
    unknown = got[("descheduler", "42")]
    assert math.isnan(unknown["vs_off"]) and unknown["met"] is None
    assert "no big job started" in verdict_line(unknown, 1.0)
