"""Write a simulation's results: `summary.csv`, `by_size.csv`, `runs.csv`, `targets.csv` (the
three targets checked against the advisor off, `targets.py`) and two plots.

Plots (matplotlib, Agg backend): `wait_cdf.png`, the distribution of waits per job size, one
panel per size and one line per scheduler x advisor mode (seeds pooled); `allocation.png`,
allocated GPUs as a share of capacity over simulated hours, one line per scheduler x advisor
mode (the first seed), GPUs held for reservations dashed below.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from advisor.simulate.metrics import BY_SIZE_COLUMNS, SUMMARY_COLUMNS, _label_order
from advisor.simulate.run import Outcome
from advisor.simulate.targets import TARGET_COLUMNS

RUN_COLUMNS = (
    "policy",
    "advisor",
    "seed",
    "wall_s",
    "advisor_calls",
    "advisor_s_per_call",
    "advisor_s_max",
    "advisor_cpu_s_per_call",
    "consolidations",
    "reservations",
    "renewals",
    "skipped_holds",
    "preemptive",
    "reclaims",
    "skipped_taken",
    "skipped_budget",
    "budget_spent",
    "failed",
    "never_fit",
    "reused",
    "again",
    "small_waiting",
    "skipped_fit",
    "wrong_model",
)


def write_csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """`rows` under `columns`; an unknown (NaN) is an empty cell, as `--json` gives it null."""
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: "" if _nan(v) else v for k, v in row.items()} for row in rows)


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def run_row(outcome: Outcome) -> dict[str, Any]:
    s, notes = outcome.summary, outcome.notes
    calls = outcome.advisor_calls
    return {
        "policy": s["policy"],
        "advisor": s["advisor"],
        "seed": s["seed"],
        "wall_s": round(outcome.wall_s, 2),
        "advisor_calls": calls,
        "advisor_s_per_call": round(sum(outcome.advisor_s) / calls, 4) if calls else "",
        "advisor_s_max": round(max(outcome.advisor_s), 4) if calls else "",
        "advisor_cpu_s_per_call": round(sum(outcome.advisor_cpu_s) / calls, 4) if calls else "",
        **{k: _note(notes.get(k, "")) for k in RUN_COLUMNS[8:]},
    }


def _note(value: Any) -> Any:
    """A count per kind (`{"heuristic": 7}`) as `heuristic:7` (`;` between kinds)."""
    if isinstance(value, dict):
        return ";".join(f"{k}:{v}" for k, v in sorted(value.items()))
    return value


def write_all(
    folder: Path, outcomes: list[Outcome], title: str, targets: list[dict[str, Any]]
) -> list[str]:
    """Every file into `folder` (a staged folder: all of them or none reach --out); `targets`:
    `target_rows` of the outcomes' summaries."""
    write_csv(folder / "summary.csv", SUMMARY_COLUMNS, [o.summary for o in outcomes])
    write_csv(folder / "by_size.csv", BY_SIZE_COLUMNS, [r for o in outcomes for r in o.by_size])
    write_csv(folder / "runs.csv", RUN_COLUMNS, [run_row(o) for o in outcomes])
    write_csv(folder / "targets.csv", TARGET_COLUMNS, targets)
    plot_wait_cdf(outcomes, folder / "wait_cdf.png", title)
    plot_allocation(outcomes, folder / "allocation.png", title)
    return list(FILES)


FILES = (
    "summary.csv",
    "by_size.csv",
    "runs.csv",
    "targets.csv",
    "wait_cdf.png",
    "allocation.png",
)


def _label(outcome: Outcome) -> str:
    return f"{outcome.summary['policy']} / advisor {outcome.summary['advisor']}"


# one colour per scheduler, one line style per advisor mode
MODE_STYLE = {
    "off": {"ls": "-", "lw": 1.0},
    "on": {"ls": "-", "lw": 2.4},
    "descheduler": {"ls": "--", "lw": 1.2},
    "consolidate": {"ls": ":", "lw": 1.6},
}


def _style(outcomes: list[Outcome]) -> dict[str, dict[str, Any]]:
    import matplotlib

    policies = list(dict.fromkeys(o.summary["policy"] for o in outcomes))
    colours = matplotlib.colormaps["tab10"]
    return {
        _label(o): {
            "color": colours(policies.index(o.summary["policy"]) % 10),
            **MODE_STYLE.get(o.summary["advisor"], {}),
        }
        for o in outcomes
    }


def _size_title(size: str, jobs: int) -> str:
    what = {"cpu": "CPU-only jobs", "<1": "jobs of a shared GPU", "1": "jobs of 1 GPU"}
    return f"{what.get(size, f'jobs of {size} GPUs')} ({jobs} per run)"


def plot_wait_cdf(outcomes: list[Outcome], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    waits: dict[str, dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    for o in outcomes:
        for size in set(o.sizes.tolist()):
            waits[size][_label(o)].append(o.waits[o.sizes == size])
    sizes = sorted(waits, key=_label_order)
    cols = min(3, max(1, len(sizes)))
    rows = (len(sizes) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    labels = list(dict.fromkeys(_label(o) for o in outcomes))
    style = _style(outcomes)
    for ax, size in zip(axes.flat, sizes, strict=False):
        for label in labels:
            parts = waits[size].get(label)
            if not parts:
                continue
            w = np.sort(np.concatenate(parts))
            y = np.arange(1, len(w) + 1) / len(w)
            ax.step(np.maximum(w, 1.0), y, where="post", label=label, **style[label])
        n = len(next(iter(waits[size].values()))[0])
        ax.set_xscale("log")
        ax.set_xlim(left=1.0)
        ax.set_title(_size_title(size, n))
        ax.set_xlabel("wait (s, waits under 1 s at 1)")
        ax.set_ylabel("share of jobs")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(sizes) :]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(4, len(names)), fontsize=8)
    fig.suptitle(f"wait by job size: {title}")
    fig.tight_layout(rect=(0, 0.06 + 0.02 * (len(names) // 4), 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_allocation(outcomes: list[Outcome], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first_seed = min(o.summary["seed"] for o in outcomes) if outcomes else 0
    policies = list(dict.fromkeys(o.summary["policy"] for o in outcomes))
    cols = min(2, max(1, len(policies)))
    rows = (len(policies) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.6 * rows), squeeze=False)
    colours = matplotlib.colormaps["tab10"]
    modes = list(MODE_STYLE)
    for ax, policy in zip(axes.flat, policies, strict=False):
        for o in outcomes:
            if o.summary["policy"] != policy or o.summary["seed"] != first_seed:
                continue
            if not len(o.curve):
                continue
            mode = o.summary["advisor"]
            colour = colours(modes.index(mode) % 10 if mode in modes else 9)
            t, alloc, held = o.curve[:, 0], o.curve[:, 1], o.curve[:, 2]
            total = o.capacity_gpus or max(float(alloc.max()), 1.0)
            ax.step(t, alloc / total, where="post", color=colour, label=f"advisor {mode}")
            if held.any():
                ax.step(t, held / total, where="post", ls="--", color=colour, lw=0.8)
        ax.set_title(policy)
        ax.set_xlabel("simulated hours since the first submission")
        ax.set_ylabel("allocated share (held: dashed)")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(policies) :]:
        ax.axis("off")
    fig.suptitle(f"allocation over time: {title} (seed {first_seed})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
