"""Service job ends: how close the learned ends come to the simulator's true ends, against the
duration prior, and what learning and predicting them adds to a run of the advisor loop.

Accuracy. Each `sim:` fleet is observed hourly from t = 0 (the service's `sim:` start-up
backfill) by a `JobLifetimes` fed the models in time order (what `History.append` does, without
the fragmentation analysis it also runs). At every origin (default every 12 h from 72 h to
168 h) each running job with a learned end (`advisor.forecast.job_ends.predict`, default
`JobEndSettings`, the starts the history used) is scored against the simulator's true end
(`SimJob.end`: the simulator draws a job's duration when it starts it, so the end is known
exactly), as is the duration prior (`advisor.planner.observed.expected_end` without `job_end`;
the simulated models carry no deletion times, so the prior is the Pareto one). A job is scored
once per origin it runs at; jobs without a learned end (older than all but a few finished
jobs) keep the prior and are only counted, with the prior's error on them. Seeds are pooled.

Cost. `AdvisorLoop.run_once` on `sim:a100-16x8?nodes=N` after the service's start-up backfill
(hourly, `--backfill-h`), one run per simulated minute (the service's default interval). The
time spent in job-end work is measured inside the run: `running_jobs` and
`JobLifetimes.observe` in `History.append` (tracking), `History.finished_jobs`,
`JobLifetimes.running` and `job_ends.predict` in the plan stage (prediction); the rest of the
run is the baseline (its ingest is the simulator stepping a minute and building the model).
Medians over `--runs` runs after `--warmup` runs; the hourly forecast is not recomputed in them.

Usage: python bench/job_ends.py [--fleets a100-16x8,a100-16x8?nodes=64,...] [--from-h 72]
    [--to-h 168] [--every-h 12] [--seeds 42,1,2,3,4] [--by-origin] [--cost-nodes 16,128,512]
    [--runs 15] [--warmup 2] [--backfill-h 72] [--skip-accuracy] [--skip-cost]
(about 45 s on 2 cores; --seeds 42 --cost-nodes 16,128 for a quick look)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's exporter, not bench/'s

import advisor.history.observations as H  # History.append calls running_jobs from here
import advisor.pipeline.stages as P
from advisor.forecast.job_ends import JobEndSettings, predict
from advisor.history import JobLifetimes
from advisor.ingest.live import LiveSim
from advisor.ingest.sources import sim_fleet, sim_model
from advisor.planner.observed import expected_end
from advisor.service.loop import AdvisorLoop, Config
from bench.machine import describe

HOUR = 3600.0
FLEETS = "a100-16x8,a100-16x8?nodes=64,mixed-h100-a100-v100?nodes=64"


# --------------------------------------------------------------------------- accuracy


def accuracy(
    fleet_spec: str,
    seed: int,
    origins_h: list[float],
    step_h: float = 1.0,
    settings: JobEndSettings | None = None,
):
    """Observe `sim:fleet_spec` every `step_h` from t = 0 to the last origin; at each origin
    score every running job's learned and prior end against its true end. Returns the scored
    rows (origin h; learned, prior and true remaining s; elapsed h; job), the counts of jobs not
    scored and why, the prior's errors on the jobs without a learned end, and the fleet's GPU
    count."""
    spec = f"sim:{fleet_spec}{'&' if '?' in fleet_spec else '?'}seed={seed}"
    fleet, _ = sim_fleet(spec)
    epoch = fleet.unix_time - fleet.now
    lifetimes = JobLifetimes()  # History's defaults (5000 finished, 2 h gap)
    settings = settings or JobEndSettings()
    origins = {round(h * HOUR) for h in origins_h}
    rows = []
    kept = []  # the prior's absolute error (h) on the jobs without a learned end
    counts: dict[str, int] = defaultdict(int)
    for at in np.arange(0.0, max(origins) + 1.0, step_h * HOUR):
        fleet.advance(float(at) - fleet.now)
        model = sim_model(fleet, spec)
        lifetimes.observe(model)
        if round(at) not in origins:
            continue
        assert not np.isfinite(model.allocations.deletion_time).any()  # the prior is the prior
        now = model.timestamp
        truth: dict[tuple[str, str], float] = {}
        for job in fleet.running_jobs():
            key = (job.tenant, job.name)
            counts["name_clashes"] += key in truth
            truth[key] = epoch + job.end
        running = lifetimes.running(now)
        ends, doc = predict(model, lifetimes.frame(), settings, running=running)
        prior = dict(zip(model.allocations.id.tolist(), expected_end(model).tolist(), strict=True))
        counts["finished_at_last_origin"] = doc["finished_jobs"]
        for job in running or ():
            counts["running"] += 1
            if not np.isfinite(job.start):  # the MIG node's static inference pods
                counts["unknown_start"] += 1
                continue
            real = truth.get((job.tenant, job.job))
            if real is None:
                counts["no_truth"] += 1
                continue
            learned = ends.get(job.allocations[0])
            if learned is None:
                counts["no_learned_end"] += 1
                counts["no_learned_end_few_finished"] += doc["predicted_jobs"] == 0
                kept.append(abs(prior[job.allocations[0]] - real) / HOUR)
                continue
            rows.append(
                (
                    at / HOUR,
                    learned - now,
                    prior[job.allocations[0]] - now,
                    real - now,
                    (now - job.start) / HOUR,
                    (seed, job.tenant, job.job, job.start),
                )
            )
    return rows, counts, kept, fleet.gpu_count


def summary(rows: list[tuple]) -> dict[str, float]:
    """Errors of the learned and the prior ends (hours) over scored rows."""
    learned, prior, real = (np.array([r[i] for r in rows]) / HOUR for i in (1, 2, 3))
    err_l, err_p = np.abs(learned - real), np.abs(prior - real)
    return {
        "scored": len(rows),
        "distinct": len({r[5] for r in rows}),
        "median_learned": float(np.median(err_l)),
        "median_prior": float(np.median(err_p)),
        "mean_learned": float(np.mean(err_l)),
        "mean_prior": float(np.mean(err_p)),
        "early_learned": float(np.mean(learned < real)),
        "early_prior": float(np.mean(prior < real)),
        "learned_better": float(np.mean(err_l < err_p)),
        "remaining_median_h": float(np.median(real)),
        "elapsed_median_h": float(np.median([r[4] for r in rows])),
    }


def errors_line(r: dict[str, float]) -> str:
    return (
        f"median |error| {r['median_learned']:.1f} h learned vs {r['median_prior']:.1f} h prior "
        f"(ratio {r['median_learned'] / r['median_prior']:.2f}); mean {r['mean_learned']:.1f} vs "
        f"{r['mean_prior']:.1f} h (ratio {r['mean_learned'] / r['mean_prior']:.2f}); learned "
        f"before the true end {100 * r['early_learned']:.0f} % (prior "
        f"{100 * r['early_prior']:.0f} %); learned closer for {100 * r['learned_better']:.0f} %"
    )


def served_line(errors: list[float]) -> str:
    e = np.asarray(errors, float)
    return (
        f"served end (learned where any, else the prior) over {len(e)} job x origin: "
        f"median |error| {np.median(e):.2f} h, mean {e.mean():.2f} h"
    )


# --------------------------------------------------------------------------- cost


class Timers:
    """Seconds spent in the wrapped job-end functions, per label, since the last `reset`."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)

    def wrap(self, label: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[label] += time.perf_counter() - t0

        return timed

    def reset(self) -> dict[str, float]:
        out, self.spent = dict(self.spent), defaultdict(float)
        return out


@contextmanager
def instrumented(loop: AdvisorLoop, timers: Timers):
    """Time the job-end work of `loop`'s runs: the history's tracking and the plan stage's
    prediction (module functions patched for the duration, instance methods wrapped)."""
    saved = (H.running_jobs, P.predict)
    history, jobs = loop.history, loop.history.jobs
    H.running_jobs = timers.wrap("tracking", H.running_jobs)  # History.append's call
    P.predict = timers.wrap("predict", P.predict)  # the plan stage's call
    jobs.observe = timers.wrap("tracking", jobs.observe)
    jobs.running = timers.wrap("predict", jobs.running)
    history.finished_jobs = timers.wrap("frame", history.finished_jobs)
    try:
        yield
    finally:
        H.running_jobs, P.predict = saved
        del jobs.observe, jobs.running, history.finished_jobs


def cost(nodes: int, runs: int, warmup: int, backfill_h: float, interval_s: float = 60.0) -> dict:
    now = [0.0]
    source = LiveSim(f"sim:a100-16x8?nodes={nodes}", clock=lambda: now[0])
    loop = AdvisorLoop("sim", source, Config())
    t0 = time.perf_counter()
    loop.seed_history(source.backfill(backfill_h * HOUR))
    seeded = time.perf_counter() - t0
    timers = Timers()
    parts: dict[str, list[float]] = defaultdict(list)
    doc = {}
    with instrumented(loop, timers):
        for k in range(warmup + runs):
            now[0] += interval_s
            timers.reset()
            t0 = time.perf_counter()
            state = loop.run_once()
            total = time.perf_counter() - t0
            spent = timers.reset()
            if k < warmup:
                continue
            assert not state.stale, state.last_error
            doc = state.results.recommendations["job_ends"]
            for label in ("tracking", "frame", "predict"):
                parts[label].append(spent.get(label, 0.0))
            parts["added"].append(sum(spent.values()))
            parts["total"].append(total)
            parts["rest"].append(total - parts["added"][-1])
            parts["ratio"].append(parts["added"][-1] / parts["rest"][-1])
            for stage, seconds in state.stage_seconds.items():
                parts[stage].append(seconds)
    ratio = float(np.median(parts.pop("ratio")))
    ms = {key: 1e3 * float(np.median(values)) for key, values in parts.items()}
    return {
        "nodes": nodes,
        "gpus": nodes * 8,
        "backfill_s": seeded,
        "finished": doc.get("finished_jobs"),
        "running": doc.get("running_jobs"),
        "predicted": doc.get("predicted_jobs"),
        "source": doc.get("source"),
        "ms": ms,
        "ratio": ratio,
        "forecast_runs": sum(s > 0.01 for s in parts["forecast"]),
    }


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleets", default=FLEETS, help="comma-separated sim: specs (no 'sim:')")
    ap.add_argument("--from-h", type=float, default=72.0)
    ap.add_argument("--to-h", type=float, default=168.0)
    ap.add_argument("--every-h", type=float, default=12.0)
    ap.add_argument("--seeds", default="42,1,2,3,4", help="comma-separated simulator seeds, pooled")
    ap.add_argument("--by-origin", action="store_true", help="errors per origin too")
    ap.add_argument("--cost-nodes", default="16,128,512")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--backfill-h", type=float, default=72.0)
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--skip-cost", action="store_true")
    ap.add_argument(
        "--min-similar",
        type=int,
        default=JobEndSettings().min_similar,
        help="JobEndSettings.min_similar: finished jobs that must have outlived a job for its "
        "learned end (fewer: the prior serves)",
    )
    args = ap.parse_args()
    print(describe())
    started = time.perf_counter()
    if not args.skip_accuracy:
        origins = [float(h) for h in np.arange(args.from_h, args.to_h + 1e-9, args.every_h)]
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        print(
            f"accuracy: hourly observations from t = 0, origins {origins[0]:g}..{origins[-1]:g} h "
            f"every {args.every_h:g} h ({len(origins)}), seeds {args.seeds}; absolute error of "
            "the predicted end vs the simulator's true end, in hours, learned vs prior"
        )
        settings = JobEndSettings(min_similar=args.min_similar)
        served_all: list[float] = []
        for fleet_spec in [f.strip() for f in args.fleets.split(",") if f.strip()]:
            t0 = time.perf_counter()
            rows, counts, kept = [], defaultdict(int), []
            for seed in seeds:
                more, c, prior_only, gpus = accuracy(fleet_spec, seed, origins, settings=settings)
                rows += more
                kept += prior_only
                for key, value in c.items():
                    counts[key] += value
            r = summary(rows)
            print(
                f"  {fleet_spec} ({gpus} GPUs): {r['scored']} job x origin scored "
                f"({r['distinct']} distinct jobs; median elapsed {r['elapsed_median_h']:.1f} h, "
                f"true remaining {r['remaining_median_h']:.1f} h); not scored: "
                f"{counts['no_learned_end']} of {counts['running']} running without a learned "
                f"end (kept the prior, median |error| "
                f"{np.median(kept) if kept else float('nan'):.1f} h; "
                f"{counts['no_learned_end_few_finished']} for too few finished jobs), {counts['unknown_start']} with no start time, "
                f"{counts['no_truth']} without a true end; {counts['finished_at_last_origin']} "
                f"finished jobs learned by {origins[-1]:g} h; {time.perf_counter() - t0:.1f} s"
            )
            print(f"    {errors_line(r)}")
            # what the service plans on: the learned end where there is one, else the prior
            served = [abs(row[1] - row[3]) / HOUR for row in rows] + list(kept)
            served_all += served
            print(f"    {served_line(served)}")
            if counts["name_clashes"]:
                print(f"    note: {counts['name_clashes']} running (tenant, job) name clashes")
            if args.by_origin:
                for h in origins:
                    mine = [row for row in rows if row[0] == h]
                    if mine:
                        o = summary(mine)
                        print(f"      {h:g} h ({o['scored']}): {errors_line(o)}")
        print(f"  all fleets, min_similar {args.min_similar}: {served_line(served_all)}")
    if not args.skip_cost:
        sizes = [int(n) for n in args.cost_nodes.split(",") if n.strip()]
        print(
            f"cost: AdvisorLoop.run_once on sim:a100-16x8?nodes=N after a {args.backfill_h:g} h "
            f"hourly backfill, a run per simulated minute, median of {args.runs} runs "
            f"(after {args.warmup} warm-up)"
        )
        for n in sizes:
            r = cost(n, args.runs, args.warmup, args.backfill_h)
            ms = r["ms"]
            print(
                f"  {r['nodes']} nodes ({r['gpus']} GPUs; {r['finished']} finished, "
                f"{r['running']} running, {r['predicted']} predicted; backfill "
                f"{r['backfill_s']:.1f} s): job ends {ms['added']:.1f} ms (tracking "
                f"{ms['tracking']:.1f} + finished-jobs frame {ms['frame']:.1f} + predict "
                f"{ms['predict']:.1f}) on top of {ms['rest']:.1f} ms for the rest of the run: "
                f"+{100 * r['ratio']:.0f} %"
            )
            print(
                "    run stages (with the job-end work): "
                + ", ".join(f"{s} {ms[s]:.1f}" for s in ("ingest", "analyze", "forecast", "plan"))
                + f" ms; the forecast was recomputed in {r['forecast_runs']} of the timed runs"
            )
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
