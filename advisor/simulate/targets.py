"""The replay's three targets, checked by the tool: each defragmenting mode's row against the
same scheduler and seed with the advisor off, and, over several seeds, their median.

A row is met when the P90 wait of jobs of 8+ GPUs is at most `HALVING` of the same scheduler's
with the advisor off (`halved`), at most the migration budget's share of placed tasks moved per
simulated day (`within_budget`), and the GPU-hours its restarts and holds cost below the waiting
GPU-hours it saved against off (`cost_below_saved`). `better_than` names the other modes of the
same scheduler and seed it beats on those figures together: a shorter big-job P90, more waiting
GPU-hours saved net of what it cost, within the budget. A figure that cannot be judged (no big
job waited with the advisor off, so there is nothing to halve; no off row for that scheduler and
seed) is unknown (an empty cell, null in JSON), never a pass or a fail.

Pure functions of summary rows (`metrics.summary_row`), so the same check runs on a finished
`summary.csv`.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

HALVING = 0.5  # the target: the big jobs' P90 wait at most half of the same scheduler's, off
POOLED = "median"  # the seed column of a row pooled over seeds

TARGET_COLUMNS = (
    "policy",
    "advisor",
    "seed",
    "seeds",
    "wait_p90_s_big_off",
    "wait_p90_s_big",
    "vs_off",
    "saved_gpu_hours",
    "cost_gpu_hours",
    "moved_pct_per_day",
    "halved",
    "within_budget",
    "cost_below_saved",
    "met",
    "met_seeds",
    "better_than",
)


def target_rows(summary: Iterable[Mapping[str, Any]], budget_pct: float) -> list[dict[str, Any]]:
    """One row per replay with the advisor not off (in `summary`'s order), then, where a scheduler
    x mode ran more than one seed, one row of the medians over its seeds (`seed` = "median")."""
    rows = list(summary)
    off = {(r["policy"], r["seed"]): r for r in rows if r["advisor"] == "off"}
    checked = [
        _check(r, off.get((r["policy"], r["seed"])), budget_pct)
        for r in rows
        if r["advisor"] != "off"
    ]
    pooled: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for row in checked:
        pooled[(row["policy"], row["advisor"])].append(row)
    out = checked + [_median(group, budget_pct) for group in pooled.values() if len(group) > 1]
    rivals: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for row in out:
        rivals[(row["policy"], row["seed"])].append(row)
    for row in out:
        group = rivals[(row["policy"], row["seed"])]
        row["better_than"] = ";".join(o["advisor"] for o in group if _beats(row, o))
    return out


def _check(
    row: Mapping[str, Any], off: Mapping[str, Any] | None, budget_pct: float
) -> dict[str, Any]:
    if off is None:
        base = math.nan
        saved = math.nan
    else:
        base = _number(off["wait_p90_s_big"])
        saved = _number(off["wait_gpu_hours"]) - _number(row["wait_gpu_hours"])
    return _judged(
        {
            "policy": row["policy"],
            "advisor": row["advisor"],
            "seed": row["seed"],
            "seeds": 1,
            "wait_p90_s_big_off": base,
            "wait_p90_s_big": _number(row["wait_p90_s_big"]),
            "saved_gpu_hours": round(saved, 2),
            "cost_gpu_hours": round(
                _number(row["restart_gpu_hours"]) + _number(row["held_gpu_hours"]), 2
            ),
            "moved_pct_per_day": _number(row["moved_pct_per_day"]),
        },
        budget_pct,
    )


def _number(value: Any) -> float:
    """A summary figure as a float; unknown (summary.csv's empty cell, JSON's null) is NaN."""
    return math.nan if value is None or value == "" else float(value)


def _judged(row: dict[str, Any], budget_pct: float) -> dict[str, Any]:
    """`row` with its ratio to off and the three verdicts (None where unknown)."""
    base, p90 = row["wait_p90_s_big_off"], row["wait_p90_s_big"]
    known = not (math.isnan(base) or math.isnan(p90)) and base > 0
    row["vs_off"] = round(p90 / base, 4) if known else math.nan
    row["halved"] = p90 <= HALVING * base if known else None
    row["within_budget"] = row["moved_pct_per_day"] <= budget_pct
    saved = row["saved_gpu_hours"]
    row["cost_below_saved"] = None if math.isnan(saved) else row["cost_gpu_hours"] < saved
    verdicts = (row["halved"], row["within_budget"], row["cost_below_saved"])
    row["met"] = None if None in verdicts else all(verdicts)
    row["met_seeds"] = int(bool(row["met"]))
    return row


def _beats(row: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Shorter big-job P90, more saved net of cost, within the budget: all three together."""
    if row is other or not row["within_budget"]:
        return False
    net = row["saved_gpu_hours"] - row["cost_gpu_hours"]
    other_net = other["saved_gpu_hours"] - other["cost_gpu_hours"]
    return bool(row["wait_p90_s_big"] < other["wait_p90_s_big"] and net > other_net)


def _median(group: list[dict[str, Any]], budget_pct: float) -> dict[str, Any]:
    """The medians of one scheduler x mode's figures over its seeds, judged as one row;
    `met_seeds` counts the seeds whose own row met all three."""

    def med(key: str) -> float:
        values = [float(r[key]) for r in group if not math.isnan(float(r[key]))]
        return round(statistics.median(values), 4) if values else math.nan

    row = _judged(
        {
            "policy": group[0]["policy"],
            "advisor": group[0]["advisor"],
            "seed": POOLED,
            "seeds": len(group),
            "wait_p90_s_big_off": med("wait_p90_s_big_off"),
            "wait_p90_s_big": med("wait_p90_s_big"),
            "saved_gpu_hours": med("saved_gpu_hours"),
            "cost_gpu_hours": med("cost_gpu_hours"),
            "moved_pct_per_day": med("moved_pct_per_day"),
        },
        budget_pct,
    )
    row["vs_off"] = med("vs_off")  # the median ratio, not the ratio of the medians
    if not math.isnan(row["vs_off"]):
        row["halved"] = row["vs_off"] <= HALVING
    row["met_seeds"] = sum(1 for r in group if r["met"])
    return row


def verdict_line(row: Mapping[str, Any], budget_pct: float) -> str:
    """One line a person reads at the end of a run."""
    seeds = f"median of {row['seeds']} seeds" if row["seed"] == POOLED else f"seed {row['seed']}"
    ratio = _unknown_ratio(row) if math.isnan(row["vs_off"]) else f"{row['vs_off']:.2f}x of off"
    saved = row["saved_gpu_hours"]
    saved_text = "unknown" if math.isnan(saved) else f"{saved:,.1f}"
    beats = row["better_than"].replace(";", ", ") if row["better_than"] else "none"
    met = {True: "met", False: "missed", None: "unknown"}
    line = (
        f"{row['policy']:>14} advisor {row['advisor']:<11} {seeds}: big-job p90 {ratio} "
        f"(<= {HALVING:g}: {met[row['halved']]}), moved {row['moved_pct_per_day']:.2f} %/day "
        f"(<= {budget_pct:g}: {met[row['within_budget']]}), cost {row['cost_gpu_hours']:,.1f} vs "
        f"saved {saved_text} GPU-h ({met[row['cost_below_saved']]}): "
        f"targets {met[row['met']]}"
    )
    if row["seed"] == POOLED:
        line += f" (all three on {row['met_seeds']} of {row['seeds']} seeds)"
    return f"{line}; better on all three than: {beats}"


def _unknown_ratio(row: Mapping[str, Any]) -> str:
    """Why a row has no ratio to off, as the figures say."""
    if math.isnan(row["saved_gpu_hours"]):
        return "n/a (no advisor-off replay of this scheduler and seed)"
    if math.isnan(row["wait_p90_s_big_off"]):
        return "n/a (no big job started with the advisor off)"
    if math.isnan(row["wait_p90_s_big"]):
        return "n/a (no big job started)"
    return "n/a (no big job waited with the advisor off: nothing to halve)"
