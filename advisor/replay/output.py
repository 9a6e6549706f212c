"""Write replay results: `curve.csv`, `summary.csv` and a plot (matplotlib, Agg backend)."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

CURVE_COLUMNS = (
    "policy",
    "seed",
    "arrived_pct",
    "unallocated_gpu_pct",
    "frag_amount_pct",
    "frag_rate",
)
SUMMARY_COLUMNS = (
    "policy",
    "seed",
    "migration_budget",
    "migrated_pods",
    "unalloc_100",
    "unalloc_130",
    "trace",
    "placed",
    "failed",
    "migration_cost_gpu",
    "wall_s",
)


def write_csv(path: Path, columns: tuple[str, ...], rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def median_curves(curve_rows: list[dict], column: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per policy: arrived-% bins and the median over seeds of `column` (Fig. 9a convention)."""
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in curve_rows:
        acc[row["policy"]][int(row["arrived_pct"])].append(float(row[column]))
    out = {}
    for policy, bins in acc.items():
        xs = np.array(sorted(bins))
        out[policy] = (xs, np.array([np.median(bins[x]) for x in xs]))
    return out


def plot(curve_rows: list[dict], path: Path, title: str = "") -> None:
    """Unallocated GPU % and fragment amount % against arrived workload, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, column, label in (
        (axes[0], "unallocated_gpu_pct", "unallocated GPU (% of capacity)"),
        (axes[1], "frag_amount_pct", "fragment amount (% of capacity)"),
    ):
        for policy, (xs, ys) in sorted(median_curves(curve_rows, column).items()):
            ax.plot(xs, ys, label=policy, linewidth=1.4)
        ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    xs = np.linspace(0, 130, 131)
    axes[0].plot(xs, np.maximum(100 - xs, 0), "k:", linewidth=1, label="ideal")
    axes[0].set_xlim(75, 130)
    axes[0].set_ylim(0, 25)
    axes[0].legend(fontsize=8)
    fig.suptitle(title or "trace replay (median over seeds)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_budget(
    summary_rows: list[dict], path: Path, title: str = "", bound: float | None = None
) -> None:
    """Unallocated GPU % at 100 % arrival against migration budget, one line per base policy,
    with `bound` (what no placement, however many moves, can go below) as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in summary_rows:
        base = str(row["policy"]).split("+mig")[0]
        acc[base][float(row["migration_budget"])].append(float(row["unalloc_100"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, by_budget in sorted(acc.items()):
        xs = sorted(by_budget)
        ys = [float(np.mean(by_budget[x])) for x in xs]
        ax.plot([100 * x for x in xs], ys, marker="o", label=policy)
    if bound is not None:
        ax.axhline(bound, color="grey", linestyle="--", label="packing bound (any placement)")
    ax.set_xlabel("migration budget (% of placed pods)")
    ax.set_ylabel("unallocated GPU at 100 % arrival (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "gain against migration budget (mean over seeds)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
