"""The advisor beside Nixtla statsforecast, on the backtest's own protocol and scoring.

For Philly, Helios Earth and Alibaba (../shared/data) this runs `gpu-defrag backtest`'s demand
part (`advisor.forecast.rolling.run`: the same hourly panel, test split, origins and masked
hours) and statsforecast's Naive, SeasonalNaive (24 h), AutoETS, AutoTheta, AutoARIMA (24 h
seasons) and MSTL (24 h and 168 h seasons), out of the box, on the same origins: refit at the
first origin of each test day on the rows up to it, moved on hour by hour in between
(bench/peers_worker.py, in its own environment: statsforecast needs pandas < 3). Their P90 is
the upper end of their 80 % interval. Every forecast, theirs and ours, is clipped to [0,
capacity at the target] and scored by `rolling.score`, the CLI's scoring: a masked actual is
not scored. statsforecast's Naive must agree with ours to the digit (it is checked and printed):
that is the check that both sides saw the same origins, hours and masks.

Prints one table per data set: model × horizon × MAE (mean over series), WAPE (median over
series, in %), P90 pinball and coverage (medians) and the wall time of the model's whole test
part (ours: naive alone, and the advisor with its selection and every candidate). Earth's rows
are over its 8 VCs; its total is printed apart.

`--history H` limits the hours each peer fit and each hourly update sees to the last H (default
0: everything, as our models see): AutoARIMA's fit (its stepwise search, 26 s of CPU on four weeks
of hours) makes it by far the slowest, and its daily refits dominate the run. `--jobs N` runs the
peers' model × series tasks in N processes; a model's time is then the sum of its tasks' times.
`--peers-only` leaves the advisor's backtest out (naive, for the check, stays). `--test-from` /
`--test-to` score another part, e.g. weeks of the training part (the advisor still picks on the
days before it).

Usage: OMP_NUM_THREADS=1 python bench/forecast_peers.py [--data philly,earth,alibaba] [--philly PATH]
       [--peers-python .venv-peers/bin/python] [--models Naive,AutoETS,...] [--history 0]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.forecast import io, rolling
from advisor.forecast.models import clip_to_capacity
from advisor.forecast.panel import Panel
from bench.machine import describe

ROOT = Path(__file__).resolve().parents[1]

SHARED = ROOT.parent / "shared" / "data"
INPUTS = {
    "philly": SHARED / "forecast" / "philly" / "philly_node_sequence.csv",
    "earth": SHARED / "forecast" / "helios-earth",
    "alibaba": SHARED / "openb" / "openb_pod_list_default.csv",
}
HORIZONS = (1, 24)
QUANTILES = (0.5, 0.9)
PEERS = ("Naive", "SeasonalNaive", "AutoETS", "AutoTheta", "AutoARIMA", "MSTL")
REFIT_EVERY = 24  # as `rolling.run`'s test part: refit at the first origin of each day
MAKE_VENV = (
    "python3 -m venv .venv-peers && .venv-peers/bin/pip install -r bench/requirements-peers.txt"
)


def peer_rows(
    panel: Panel,
    origins: np.ndarray,
    python: str,
    models: list[str],
    history: int,
    jobs: int = 1,
) -> tuple[pd.DataFrame, dict[str, float], list[str]]:
    """statsforecast's forecasts at `origins` as `rolling_forecasts` rows (model `sf_<name>`),
    each model's wall time, and the errors it reported."""
    y = panel.values.to_numpy(float)
    cap = panel.capacity.reindex_like(panel.values).to_numpy(float)
    capf = pd.DataFrame(cap).ffill().to_numpy()
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(
            source,
            values=y,
            origins=origins,
            horizons=np.array(HORIZONS),
            refit_every=REFIT_EVERY,
            models=np.array(models),
            history=history,
            jobs=jobs,
        )
        done = subprocess.run(
            [python, str(ROOT / "bench" / "peers_worker.py"), str(source), str(target)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"bench/peers_worker.py failed: {done.stderr.strip()[-2000:]}")
        out = np.load(target, allow_pickle=False)
        points, upper = out["points"], out["upper"]
        seconds = dict(zip([str(m) for m in out["models"]], out["seconds"].tolist(), strict=True))
        errors = [str(e) for e in out["errors"] if str(e)]
    rows = []
    for k, name in enumerate(models):
        for i, h in enumerate(HORIZONS):
            point = clip_to_capacity(points[k, :, :, i].T, cap, origins, h)
            high = clip_to_capacity(upper[k, :, :, i].T, cap, origins, h)
            for j, series in enumerate(panel.series):
                rows.append(
                    pd.DataFrame(
                        {
                            "origin": panel.index[origins],
                            "series": series,
                            "horizon": h,
                            "model": f"sf_{name}",
                            "point": point[:, j],
                            "actual": actual(y[:, j], origins + h),
                            "capacity": capf[np.minimum(origins + h, len(y) - 1), j],
                            "q0.5": point[:, j],
                            "q0.9": np.maximum(high[:, j], point[:, j]),
                        }
                    )
                )
    fc = pd.concat(rows, ignore_index=True)
    return fc, {f"sf_{m}": s for m, s in seconds.items()}, errors


def actual(column: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The values at `targets` (NaN past the data's end, as `rolling_forecasts` drops them)."""
    inside = targets < len(column)
    return np.where(inside, column[np.minimum(targets, len(column) - 1)], np.nan)


def table(metrics: pd.DataFrame, seconds: dict[str, float]) -> pd.DataFrame:
    """model × horizon: MAE (mean), WAPE, P90 pinball and coverage (medians over series)."""
    out = metrics.groupby(["horizon", "model"]).agg(
        mae=("mae", "mean"),
        wape=("wape", "median"),
        pinball_q90=("pinball_q90", "median"),
        coverage_q90=("coverage_q90", "median"),
    )
    out["seconds"] = [seconds.get(m, np.nan) for m in out.index.get_level_values("model")]
    return out.reset_index()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="philly,earth,alibaba")
    for key in INPUTS:
        ap.add_argument(f"--{key}", help=f"the {key} input (default: ../shared's)")
    ap.add_argument("--peers-python", default=str(ROOT / ".venv-peers" / "bin" / "python"))
    ap.add_argument("--models", default=",".join(PEERS))
    ap.add_argument("--history", type=int, default=0, help="hours a peer sees (0: all)")
    ap.add_argument("--jobs", type=int, default=1, help="peer processes (model × series tasks)")
    ap.add_argument("--peers-only", action="store_true", help="no advisor row (naive still)")
    ap.add_argument("--test-from", help="another test part (a date): e.g. training weeks")
    ap.add_argument("--test-to", help="its end (a date, exclusive)")
    args = ap.parse_args()
    if not Path(args.peers_python).exists():
        raise SystemExit(f"no peers environment at {args.peers_python}; make it: {MAKE_VENV}")
    models = [m for m in args.models.split(",") if m]
    print(describe(f"history {args.history or 'all'} h"))
    verdicts = []
    for name in args.data.split(","):
        source = getattr(args, name) or str(INPUTS[name])
        panel = io.hourly(io.load(source), source)
        origins = rolling.test_window(panel, args.test_from, args.test_to)
        test_start = int(origins[0])
        t0 = time.perf_counter()
        ours = [rolling.rolling_forecasts(panel, ("naive",), HORIZONS, QUANTILES, origins)]
        seconds = {"naive": time.perf_counter() - t0}
        if not args.peers_only:  # the CLI's demand backtest, whose advisor rows are ours
            t0 = time.perf_counter()
            _metrics, fc, _picks = rolling.run(
                panel, HORIZONS, QUANTILES, args.test_from, args.test_to
            )
            seconds["advisor"] = time.perf_counter() - t0
            ours.append(fc[fc["model"] == "advisor"])
        peers, peer_seconds, errors = peer_rows(
            panel, origins, args.peers_python, models, args.history, args.jobs
        )
        seconds.update(peer_seconds)
        scored = rolling.score(pd.concat([*ours, peers]), panel, test_start, QUANTILES)
        for error in errors:
            print(f"{name}: {error}")
        if "Naive" in models:
            a = scored[scored["model"] == "naive"].set_index(["series", "horizon"])["mae"]
            b = scored[scored["model"] == "sf_Naive"].set_index(["series", "horizon"])["mae"]
            gap = float((a - b.reindex(a.index)).abs().max())
            print(
                f"{name}: naive vs statsforecast Naive, largest MAE difference over "
                f"{len(a)} series × horizons: {gap:.3g} ({'agree' if gap < 5e-7 else 'DIFFER'})"
            )
        total = scored["series"].str.endswith("/total")
        parts = [(name, scored[~total])]
        if total.any():
            parts.append((f"{name} total", scored[total]))
        for label, part in parts:
            shown = table(part, seconds)
            with pd.option_context("display.width", 200, "display.max_rows", 100):
                print(
                    f"\n{label} ({part['series'].nunique()} series, test from "
                    f"{panel.index[test_start]}):"
                )
                print(shown.round(4).to_string(index=False))
            at24 = shown[shown["horizon"] == 24].set_index("model")
            key = "wape" if part["series"].nunique() > 1 else "mae"
            peer = at24[at24.index.str.startswith("sf_") & (at24.index != "sf_Naive")][key]
            if len(peer) and "advisor" in at24.index:
                best = peer.idxmin()
                diff = 100 * (at24.loc["advisor", key] / peer.min() - 1)
                verdicts.append(
                    f"{label}: advisor {key} {at24.loc['advisor', key]:.4g} vs best "
                    f"peer {best} {peer.min():.4g} at h = 24 ({diff:+.1f} %)"
                )
    print()
    for line in verdicts:
        print(line)


if __name__ == "__main__":
    main()
