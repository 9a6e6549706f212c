"""Nixtla statsforecast's models on the backtest's origins, for bench/forecast_peers.py.

Runs in the peers' own environment (bench/requirements-peers.txt: statsforecast needs pandas < 3,
the product pins pandas 3), so it imports nothing of the product: it gets the hourly values and
the protocol from an .npz and returns forecasts in another, and forecast_peers.py scores them
with the backtest's own scoring.

The protocol is the backtest's (`advisor.forecast.rolling.rolling_forecasts`): one origin per
hour; each model is refit at the first origin of every block of `refit_every` origins (daily)
on the rows up to it, and between refits its state moves on with every hour (`forward` on the
rows up to each origin, the fitted parameters kept). A masked hour reads as the last observed
value (as the product's features and naive read it; statsforecast takes no NaN); hours before
a series' first reading are left out.

Usage (forecast_peers.py runs it): .venv-peers/bin/python bench/peers_worker.py IN.npz OUT.npz
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np

MODELS = ("Naive", "SeasonalNaive", "AutoETS", "AutoTheta", "AutoARIMA", "MSTL")
LEVEL = 80  # the central 80 % interval: its upper end is the P90


def make(name: str):
    """A fresh statsforecast model by name, out of the box but for the seasons."""
    from statsforecast import models as sf

    if name == "Naive":
        return sf.Naive()
    if name == "SeasonalNaive":
        return sf.SeasonalNaive(season_length=24)
    if name == "AutoETS":
        return sf.AutoETS(season_length=24)
    if name == "AutoTheta":
        return sf.AutoTheta(season_length=24)
    if name == "AutoARIMA":
        return sf.AutoARIMA(season_length=24)
    if name == "MSTL":
        return sf.MSTL(season_length=[24, 168])
    raise ValueError(name)


def ffill(column: np.ndarray) -> np.ndarray:
    """The last observed value at every row (NaN before the first)."""
    idx = np.where(np.isfinite(column), np.arange(len(column)), 0)
    np.maximum.accumulate(idx, out=idx)
    out = column[idx]
    out[: int(np.argmax(np.isfinite(column)))] = np.nan
    return out


def since(first: int, origin: int, history: int) -> int:
    """The first row a fit or update at `origin` sees."""
    return max(first, origin + 1 - history) if history > 0 else first


def run_model(
    name: str,
    y: np.ndarray,
    origins: np.ndarray,
    horizons: list[int],
    every: int,
    history: int = 0,
) -> tuple[np.ndarray, np.ndarray, str]:
    """(points, P90s) of shape (origins, horizons) for one series, and the first error's text;
    `history` > 0: each fit and update sees only the last `history` rows."""
    h_max = max(horizons)
    cols = [h - 1 for h in horizons]
    points = np.full((len(origins), len(horizons)), np.nan)
    upper = np.full_like(points, np.nan)
    first = int(np.argmax(np.isfinite(y)))
    error = ""
    for start in range(0, len(origins), every):
        block = origins[start : start + every]
        try:
            model = make(name).fit(y[since(first, int(block[0]), history) : int(block[0]) + 1])
        except Exception as exc:  # a model that cannot fit this history: NaN, said once
            error = error or f"{type(exc).__name__}: {exc}"
            continue
        for i, origin in enumerate(block, start=start):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    seen = y[since(first, int(origin), history) : int(origin) + 1]
                    out = model.forward(y=seen, h=h_max, level=[LEVEL])
            except Exception as exc:
                error = error or f"{type(exc).__name__}: {exc}"
                continue
            points[i] = np.asarray(out["mean"])[cols]
            upper[i] = np.asarray(out[f"hi-{LEVEL}"])[cols]
    return points, upper, error


def task(args: tuple) -> tuple[int, int, np.ndarray, np.ndarray, str, float]:
    """One model on one series: (k, j, points, P90s, first error, seconds)."""
    k, j, name, y, origins, horizons, every, history = args
    t0 = time.perf_counter()
    points, upper, error = run_model(name, y, origins, horizons, every, history)
    return k, j, points, upper, error, time.perf_counter() - t0


def main() -> None:
    source, target = sys.argv[1], sys.argv[2]
    data = np.load(source, allow_pickle=False)
    values, origins = data["values"], data["origins"]
    horizons = [int(h) for h in data["horizons"]]
    every = int(data["refit_every"])
    history = int(data["history"]) if "history" in data else 0
    jobs = int(data["jobs"]) if "jobs" in data else 1
    models = [str(m) for m in data["models"]] if "models" in data else list(MODELS)
    shape = (len(models), values.shape[1], len(origins), len(horizons))
    points, upper = np.full(shape, np.nan), np.full(shape, np.nan)
    seconds = np.zeros(len(models))
    errors = []
    make("Naive").fit(np.arange(48.0)).forward(y=np.arange(49.0), h=1, level=[LEVEL])  # load it all
    tasks = [
        (k, j, name, ffill(values[:, j]), origins, horizons, every, history)
        for k, name in enumerate(models)
        for j in range(values.shape[1])
    ]
    if jobs > 1:
        from multiprocessing import Pool

        with Pool(jobs) as pool:
            done = pool.map(task, tasks, chunksize=1)
    else:
        done = [task(t) for t in tasks]
    for k, j, p, u, error, spent in done:
        points[k, j], upper[k, j] = p, u
        seconds[k] += spent
        if error:
            errors.append(f"{models[k]} on series {j}: {error}")
    np.savez(
        target,
        models=np.array(models),
        points=points,
        upper=upper,
        seconds=seconds,
        errors=np.array(errors or [""]),
    )


if __name__ == "__main__":
    main()
