"""Job-end prediction on the real Alibaba GPU trace: a rolling-origin backtest of
`advisor.forecast.predict_job_end` (as `advisor.forecast.job_ends.predict` uses it) against the
planner's duration prior and two naive baselines, on `openb_pod_list_default.csv`.

Protocol (fixed before any result was looked at; nothing below was tuned on the results):

- Trace. Read with `advisor.ingest.openb.read_pods`. Tasks: GPU tasks (num_gpu > 0) with a
  scheduled time, whatever their phase (Running, Succeeded, Failed: every one held its GPUs
  from scheduled_time to deletion_time; the service sees a job gone whatever the reason). The
  never-scheduled Pending tasks held nothing and are left out. A task is a job (the trace has
  no job column); duration = deletion_time - scheduled_time.
- Censoring. The trace end T is the largest deletion_time in the file. Tasks still running when
  the trace was cut carry T as their deletion time (in the default list 32 GPU tasks share it,
  all phase Running; no other deletion time is shared by more than 5 tasks). `pod_phase` does not mark them: over
  4000 other "Running" tasks have earlier deletion times and are read as finished then. A task
  with deletion_time == T is right-censored at T: it never enters the history (no origin
  reaches T; asserted), it is predicted like any running task, but it is never scored on an
  error. Its pairs are counted as skipped, and per method the share of them whose predicted
  median end already falls before T (a known early miss) is printed for information only.
- Origins. From t0 = the time the `--warmup-finished`-th task (default 200) finished, every
  `--every-h` (12 h) while t < T. The window the trace covers opens around day 115; the 24
  tasks scheduled before it are the ones that lived into it (left-truncated), as a service
  started then would see them.
- At origin t: history = tasks with deletion_time <= t, with duration and group columns;
  running = tasks with scheduled_time <= t < deletion_time, elapsed = t - scheduled_time;
  actual remaining = deletion_time - t. Hours throughout.
- Groups. by = (qos, gpus): qos stands in for the tenant (the trace has none) and gpus is the
  service's own definition (`advisor.history.RunningJob.gpus`: num_gpu x gpu_milli / 1000,
  rounded to 3 places), so the backtest measures what the service would do; it splits the
  GPU-sharing tasks by share (24 shapes), so more tasks fall back to "all" than grouping by
  num_gpu would. The fallbacks are counted.
- Settings: `JobEndSettings()` defaults where they apply. A group is used when min_group (20)
  of its finished tasks outlived the elapsed time, else all finished tasks; a task with fewer
  than min_similar (5) finished tasks outliving it gets no learned end and keeps the prior, as
  in the service (the learned methods then take all three quantiles from the prior; counted);
  min_finished (30) is met at every origin by the warm-up (asserted).
- Methods, all on the same task x origin pairs:
  grouped: `predict_job_end(by=("qos", "gpus"))`, the service's method (clipped at 0 like it).
  (a) prior: the planner's fallback, `advisor.planner.observed.expected_end` without learned
      ends for an allocation with a start and no deletion time = `DurationPrior().remaining`
      (Pareto with tail index 2, median 4 h; its point is the conditional mean remaining:
      sqrt(2)*median - e while e < median/sqrt(2), else e; at least 60 s). It is the median
      slot; the other two levels are that Pareto's conditional quantiles given D > e. The
      equality with `expected_end` on a model built at one origin is asserted.
  (b) ungrouped: `predict_job_end(by=())`: the same empirical method over all finished tasks,
      with the same min_similar fallback to the prior.
  (c) elapsed: remaining = e (the Lindy rule: the median of a Pareto with tail index 1 given
      D > e); its other levels are that Pareto's: e*q/(1-q) (e/9 at 0.1, 9e at 0.9).
- Metrics per method over the uncensored pairs: median and mean absolute error of the median
  (h), mean pinball loss at 0.5 and at the upper level, coverage of the lower and upper level
  (share of pairs whose actual remaining <= the quantile; nominal = the level), the share
  predicted early (median < actual). Ratios against (a) for the four losses, and the distance
  of each coverage from its level. The same table again on the pairs where the grouped method
  had its own learned end (n >= min_similar). A task counts once per origin it runs at, so
  pairs of one long task are correlated: no intervals are claimed.
- Post hoc, off by default (`--clipped`; added after the first results were seen, not part
  of the fixed protocol above): the uncensored pairs are selected on their outcome (a task
  scored at t ended within T - t), which penalises late predictions for old tasks. Every pair,
  censored ones included, scored on the target clipped at its censor horizon c = T - t:
  min(actual, c) against min(quantile, c), the same metrics (coverage of the clipped target).
- No look-ahead: at the middle origin every time after t is altered (deletion times after t
  and scheduled times after t redrawn at random beyond t, qos and shares of tasks not yet
  scheduled shuffled) and every method's predictions are recomputed: they must be identical.

Usage: python bench/job_ends_trace.py [--trace PATH] [--every-h 12] [--warmup-finished 200]
    [--quantiles 0.1,0.5,0.9] [--min-group 20] [--min-similar 5] [--examples 0] [--clipped]
(about 1.5 s on 2 cores, imports included)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's packages

from advisor.forecast import predict_job_end
from advisor.forecast.job_ends import JobEndSettings
from advisor.ingest.openb import read_pods
from advisor.model import MILLI, ModelBuilder
from advisor.planner.observed import DurationPrior, expected_end
from bench.machine import describe

HOUR = 3600.0
TRACE = "/work/shared/data/openb/openb_pod_list_default.csv"
BY = ("qos", "gpus")
METHODS = ("grouped", "(a) prior", "(b) ungrouped", "(c) elapsed")


# --------------------------------------------------------------------------- data


def load_tasks(path: str) -> dict[str, np.ndarray]:
    """GPU tasks with a scheduled time, as arrays; `censored` marks deletion_time == trace end."""
    pods = read_pods(path)
    end = float(np.nanmax(pods.deletion_time))
    keep = (pods.num_gpu > 0) & np.isfinite(pods.scheduled_time)
    tasks = {
        "name": pods.name[keep],
        "qos": pods.qos[keep].astype(str),
        "gpus": np.round(pods.num_gpu[keep] * pods.gpu_milli[keep] / MILLI, 3),
        "scheduled": pods.scheduled_time[keep].astype(float),
        "deletion": pods.deletion_time[keep].astype(float),
    }
    assert np.isfinite(tasks["deletion"]).all() and (tasks["deletion"] > tasks["scheduled"]).all()
    tasks["censored"] = tasks["deletion"] == end
    tasks["trace_end"] = np.array(end)
    return tasks


def origins_of(tasks: dict, warmup_finished: int, every_h: float) -> np.ndarray:
    finished = np.sort(tasks["deletion"][~tasks["censored"]])
    if len(finished) < warmup_finished:
        raise SystemExit(f"only {len(finished)} finished tasks, fewer than --warmup-finished")
    t0 = finished[warmup_finished - 1]
    return np.arange(t0, float(tasks["trace_end"]), every_h * HOUR)


def snapshot(tasks: dict, t: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(running, history) at origin t, from scheduled/deletion times <= t only (and the
    running tasks' own columns); the running rows keep their task index."""
    sched, dele = tasks["scheduled"], tasks["deletion"]
    done = dele <= t
    history = pd.DataFrame(
        {
            "duration_h": (dele[done] - sched[done]) / HOUR,
            "qos": tasks["qos"][done],
            "gpus": tasks["gpus"][done],
        }
    )
    idx = np.flatnonzero((sched <= t) & ~done)
    running = pd.DataFrame(
        {
            "job": idx,
            "elapsed_h": (t - sched[idx]) / HOUR,
            "qos": tasks["qos"][idx],
            "gpus": tasks["gpus"][idx],
        }
    )
    return running, history


# --------------------------------------------------------------------------- methods


def pareto_remaining(elapsed_h: np.ndarray, q: float, alpha: float, scale_h: float) -> np.ndarray:
    """q-quantile of D - e given D > e for a Pareto(alpha, scale) duration D."""
    base = np.maximum(elapsed_h, scale_h)
    return base * (1.0 - q) ** (-1.0 / alpha) - elapsed_h


def prior_quantiles(elapsed_h: np.ndarray, levels: tuple[float, ...], prior: DurationPrior):
    """The planner's prior: its point (conditional mean remaining) in the 0.5 slot, the
    Pareto's (tail index 2) conditional quantiles in the others."""
    scale_h = prior.median_s / math.sqrt(2.0) / HOUR
    out = {}
    for q in levels:
        if q == 0.5:
            out[q] = prior.remaining(elapsed_h * HOUR) / HOUR
        else:
            rest = pareto_remaining(elapsed_h, q, 2.0, scale_h)
            out[q] = np.maximum(rest, prior.min_remaining_s / HOUR)
    return out


def learned(running, history, by, levels, settings, fallback):
    """predict_job_end as the service uses it: clipped at 0; fewer than min_similar finished
    tasks outliving a task (or none): the prior. Returns (quantiles, basis, has_learned)."""
    table = predict_job_end(
        running,
        history[["duration_h", *by]],
        by=by,
        quantiles=levels,
        min_jobs=settings.min_group,
    )
    assert (table["job"].to_numpy() == running["job"].to_numpy()).all()
    n = table["n"].to_numpy()
    ok = n >= settings.min_similar
    out = {}
    for q in levels:
        value = table[f"remaining_q{q:g}"].to_numpy(float)
        ok &= np.isfinite(value)
        out[q] = value
    for q in levels:
        out[q] = np.where(ok, np.maximum(out[q], 0.0), fallback[q])
    return out, table["basis"].to_numpy(), ok


def predict_all(running, history, levels, settings, prior) -> dict:
    e = running["elapsed_h"].to_numpy(float)
    pri = prior_quantiles(e, levels, prior)
    grouped, basis, has = learned(running, history, BY, levels, settings, pri)
    ungrouped, _, has_all = learned(running, history, (), levels, settings, pri)
    lindy = {q: e * q / (1.0 - q) for q in levels}
    return {
        "grouped": grouped,
        "(a) prior": pri,
        "(b) ungrouped": ungrouped,
        "(c) elapsed": lindy,
        "_basis": basis,
        "_has": has,
        "_has_all": has_all,
    }


# --------------------------------------------------------------------------- checks


def check_prior_matches_planner(tasks: dict, t: float, prior: DurationPrior) -> None:
    """DurationPrior.remaining is what expected_end gives a running allocation with a start
    and no deletion time: build the origin's running tasks as a model and compare."""
    running, _ = snapshot(tasks, t)
    b = ModelBuilder()
    for j in running["job"].tolist():
        b.add_allocation(f"t{j}", num_gpu=1, start_time=float(tasks["scheduled"][j]))
    ends = expected_end(b.build(timestamp=t), prior)
    mine = t + prior_quantiles(running["elapsed_h"].to_numpy(float), (0.5,), prior)[0.5] * HOUR
    assert np.allclose(ends, mine, rtol=0, atol=1e-6), "prior differs from expected_end"


def check_no_lookahead(tasks: dict, t: float, levels, settings, prior, seed: int = 7) -> int:
    """Alter everything after t and recompute t's predictions: they must not change. Returns
    how many tasks were altered."""
    rng = np.random.default_rng(seed)
    alt = {k: np.array(v, copy=True) for k, v in tasks.items()}
    future_sched = alt["scheduled"] > t
    future_del = alt["deletion"] > t
    alt["scheduled"][future_sched] = t + rng.uniform(1.0, 500 * HOUR, future_sched.sum())
    alt["deletion"][future_del] = np.maximum(alt["scheduled"][future_del], t) + rng.uniform(
        1.0, 1000 * HOUR, future_del.sum()
    )
    for col in ("qos", "gpus"):
        alt[col][future_sched] = rng.permutation(alt[col][future_sched])
    assert not np.array_equal(alt["deletion"], tasks["deletion"])
    a = predict_all(*snapshot(tasks, t), levels, settings, prior)
    b = predict_all(*snapshot(alt, t), levels, settings, prior)
    for key in a:
        if isinstance(a[key], dict):
            for q in levels:
                assert np.array_equal(a[key][q], b[key][q], equal_nan=True), (key, q)
        else:
            assert np.array_equal(a[key], b[key]), key
    return int(future_del.sum())


# --------------------------------------------------------------------------- metrics


def pinball(actual: np.ndarray, pred: np.ndarray, q: float) -> float:
    d = actual - pred
    return float(np.mean(np.maximum(q * d, (q - 1.0) * d)))


def metrics(actual: np.ndarray, preds: dict, levels) -> dict[str, float]:
    lo, hi = levels[0], levels[-1]
    err = np.abs(preds[0.5] - actual)
    return {
        "medAE_h": float(np.median(err)),
        "MAE_h": float(np.mean(err)),
        "pinball_0.5": pinball(actual, preds[0.5], 0.5),
        f"pinball_{hi:g}": pinball(actual, preds[hi], hi),
        f"cover_{lo:g}": float(np.mean(actual <= preds[lo])),
        f"cover_{hi:g}": float(np.mean(actual <= preds[hi])),
        "early": float(np.mean(preds[0.5] < actual)),
    }


def table(actual: np.ndarray, pairs: dict, mask: np.ndarray, levels) -> pd.DataFrame:
    rows = {
        m: metrics(actual[mask], {q: pairs[m][q][mask] for q in levels}, levels) for m in METHODS
    }
    return pd.DataFrame(rows).T


def ratios(tab: pd.DataFrame, levels) -> pd.DataFrame:
    lo, hi = levels[0], levels[-1]
    losses = ["medAE_h", "MAE_h", "pinball_0.5", f"pinball_{hi:g}"]
    out = tab[losses] / tab.loc["(a) prior", losses]
    out.columns = [f"{c}/a" for c in losses]
    out[f"|cover_{lo:g}-{lo:g}|"] = (tab[f"cover_{lo:g}"] - lo).abs()
    out[f"|cover_{hi:g}-{hi:g}|"] = (tab[f"cover_{hi:g}"] - hi).abs()
    return out


# --------------------------------------------------------------------------- main


def levels_of(text: str) -> tuple[float, float, float]:
    levels = tuple(sorted(float(x) for x in text.split(",") if x.strip()))
    if len(levels) != 3 or levels[1] != 0.5 or not 0 < levels[0] < 0.5 < levels[2] < 1:
        raise argparse.ArgumentTypeError("three levels: lower < 0.5, 0.5, upper > 0.5")
    return levels  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=TRACE, help="an openb pod list CSV with times")
    ap.add_argument("--every-h", type=float, default=12.0, help="hours between origins")
    ap.add_argument(
        "--warmup-finished",
        type=int,
        default=200,
        help="the first origin is when this many tasks have finished",
    )
    ap.add_argument("--quantiles", type=levels_of, default=(0.1, 0.5, 0.9))
    defaults = JobEndSettings()
    ap.add_argument("--min-group", type=int, default=defaults.min_group)
    ap.add_argument("--min-similar", type=int, default=defaults.min_similar)
    ap.add_argument("--examples", type=int, default=0, help="print this many random pairs")
    ap.add_argument(
        "--clipped",
        action="store_true",
        help="post hoc: also every pair, censored included, clipped at the trace end",
    )
    args = ap.parse_args()
    print(describe())
    started = time.perf_counter()
    levels = args.quantiles
    settings = JobEndSettings(min_group=args.min_group, min_similar=args.min_similar)
    prior = DurationPrior()

    tasks = load_tasks(args.trace)
    t_end = float(tasks["trace_end"])
    origins = origins_of(tasks, args.warmup_finished, args.every_h)
    # censored tasks never finish before the trace end, so never enter any origin's history
    assert origins.max() < t_end
    check_prior_matches_planner(tasks, float(origins[len(origins) // 2]), prior)
    altered = check_no_lookahead(tasks, float(origins[len(origins) // 2]), levels, settings, prior)

    cols: dict[str, list] = {k: [] for k in ("origin", "task", "elapsed", "actual", "cens")}
    cols.update({"basis": [], "has": [], "has_all": []})
    preds: dict[str, dict[float, list]] = {m: {q: [] for q in levels} for m in METHODS}
    min_finished = math.inf
    for t in origins:
        running, history = snapshot(tasks, float(t))
        min_finished = min(min_finished, len(history))
        p = predict_all(running, history, levels, settings, prior)
        idx = running["job"].to_numpy()
        cols["origin"].append(np.full(len(idx), t))
        cols["task"].append(idx)
        cols["elapsed"].append(running["elapsed_h"].to_numpy())
        cols["actual"].append((tasks["deletion"][idx] - t) / HOUR)
        cols["cens"].append(tasks["censored"][idx])
        cols["basis"].append(p["_basis"])
        cols["has"].append(p["_has"])
        cols["has_all"].append(p["_has_all"])
        for m in METHODS:
            for q in levels:
                preds[m][q].append(p[m][q])
    assert min_finished >= settings.min_finished
    c = {k: np.concatenate(v) for k, v in cols.items()}
    pairs = {m: {q: np.concatenate(preds[m][q]) for q in levels} for m in METHODS}
    cens = c["cens"].astype(bool)
    scored = ~cens
    elapsed = time.perf_counter() - started

    lo, hi = levels[0], levels[-1]
    print(
        f"trace {args.trace}: {len(tasks['name'])} GPU tasks with a scheduled time, "
        f"{int(tasks['censored'].sum())} censored at the trace end {t_end / 86400:.2f} d "
        f"(deletion_time == the file's largest)"
    )
    print(
        f"origins: {len(origins)}, every {args.every_h:g} h from {origins[0] / 86400:.2f} d (when "
        f"{args.warmup_finished} had finished) to {origins[-1] / 86400:.2f} d; finished tasks in the "
        f"history {int(min_finished)} at the first origin, "
        f"{int((tasks['deletion'] <= origins[-1]).sum())} at the last"
    )
    print(
        f"pairs (task x origin running): {len(cens)}; scored {int(scored.sum())} "
        f"({len(np.unique(c['task'][scored]))} tasks); censored pairs skipped {int(cens.sum())} "
        f"({len(np.unique(c['task'][cens]))} tasks)"
    )
    grouped_basis = c["basis"][scored] != "all"
    has = c["has"][scored].astype(bool)
    print(
        f"grouped method on the scored pairs: own group {int((grouped_basis & has).sum())}, fell "
        f"back to all tasks {int((~grouped_basis & has).sum())}, fell back to the prior (< "
        f"{settings.min_similar} finished outlived it) {int((~has).sum())}; ungrouped fell back "
        f"to the prior on {int((~c['has_all'][scored].astype(bool)).sum())}"
    )
    print(
        f"scored pairs: median elapsed {np.median(c['elapsed'][scored]):.2f} h, actual "
        f"remaining median {np.median(c['actual'][scored]):.2f} h, mean "
        f"{np.mean(c['actual'][scored]):.1f} h; finished durations at the last origin: median "
        f"{np.median(snapshot(tasks, float(origins[-1]))[1]['duration_h']):.3f} h"
    )
    print(
        f"no look-ahead: origin {origins[len(origins) // 2] / 86400:.2f} d recomputed with the "
        f"times of {altered} tasks after it redrawn: identical predictions for every method; "
        "the prior equals expected_end on that origin's model"
    )
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        tab = table(c["actual"], pairs, scored, levels)
        print(
            f"\nall scored pairs ({int(scored.sum())}); errors in hours; cover = share with actual "
            f"<= quantile (nominal {lo:g} / {hi:g}); early = median before the actual end:"
        )
        print(tab.round(3).to_string())
        print("\nagainst (a) prior (loss ratios < 1: better than the prior; coverage: distance):")
        print(ratios(tab, levels).round(3).to_string())
        mask = scored & c["has"].astype(bool)
        tab2 = table(c["actual"], pairs, mask, levels)
        print(f"\npairs where the grouped method has its own learned end ({int(mask.sum())}):")
        print(tab2.round(3).to_string())
        print(ratios(tab2, levels).round(3).to_string())
        fallback = scored & ~c["has"].astype(bool)
        if fallback.any():
            print(
                f"\npairs where it fell back to the prior ({int(fallback.sum())}): medAE prior "
                f"{np.median(np.abs(pairs['(a) prior'][0.5][fallback] - c['actual'][fallback])):.1f} h, "
                f"elapsed {np.median(np.abs(pairs['(c) elapsed'][0.5][fallback] - c['actual'][fallback])):.1f} h"
            )
    if cens.any():
        censor = (t_end - c["origin"][cens]) / HOUR
        known = {m: float(np.mean(pairs[m][0.5][cens] < censor)) for m in METHODS}
        print(
            "\ncensored pairs, share whose median end already falls before the trace end (known "
            "early misses; not in the tables): "
            + ", ".join(f"{m} {100 * v:.0f} %" for m, v in known.items())
        )
    if args.clipped:
        horizon = (t_end - c["origin"]) / HOUR
        target = np.minimum(c["actual"], horizon)  # censored: actual > horizon
        clipped = {m: {q: np.minimum(pairs[m][q], horizon) for q in levels} for m in METHODS}
        every = np.ones(len(target), bool)
        tab3 = table(target, clipped, every, levels)
        print(
            f"\npost hoc: every pair ({len(target)}, censored included), target and quantiles "
            "clipped at the trace end (min(x, T - t)):"
        )
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(tab3.round(3).to_string())
            print(ratios(tab3, levels).round(3).to_string())
    if args.examples:
        rng = np.random.default_rng(0)
        pick = rng.choice(np.flatnonzero(scored), min(args.examples, int(scored.sum())), False)
        rows = pd.DataFrame(
            {
                "task": tasks["name"][c["task"][pick]],
                "qos": tasks["qos"][c["task"][pick]],
                "gpus": tasks["gpus"][c["task"][pick]],
                "origin_d": c["origin"][pick] / 86400,
                "elapsed_h": c["elapsed"][pick],
                "actual_h": c["actual"][pick],
                "basis": c["basis"][pick],
                **{m: pairs[m][0.5][pick] for m in METHODS},
            }
        )
        print("\nexamples (median remaining, hours):")
        print(rows.round(3).to_string(index=False))
    print(
        f"\nwall {elapsed:.1f} s (load, checks, {len(origins)} origins), total {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
