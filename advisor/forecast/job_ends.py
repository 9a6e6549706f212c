"""When each running job is likely to end, from the jobs the service has seen finish.

The history (`advisor.history.JobLifetimes`) records every job it saw run and then saw gone,
with its tenant, GPU count and duration. At each run, `predict(model, finished, settings)`
gives every running job with a known start an expected end:

    end = now + q-quantile of (D - e | D > e)

where e is the time it has run and D the durations of similar finished jobs
(`advisor.forecast.predict_job_end`: the same tenant and GPU count when at least `min_group` of
them outlived e, else all finished jobs). `quantile` is the median by default: a reservation
then plans on the end the job is as likely to beat as to miss; 0.9 plans later and holds
fewer GPUs that end up waiting.

Learned ends are used only once `min_finished` jobs have been seen to finish, and only for jobs
with a start time (given by the source, or observed by the history when the job appeared while
the service watched) that at least `min_similar` finished jobs outlived (a job that has run
longer than almost every job seen has no basis). Every other allocation keeps the planner's fallback
(`advisor.planner.observed.expected_end`: a known deletion time, else a duration prior), and the
returned document says which source the plans' reasons name and how many jobs each covered.
The ends are keyed by allocation id, so every task of a job gets its job's end.

The document also lists every running job (`jobs`, at `as_of`, the model's time), for
`/api/job-ends`: where the end is learned, its P50 and P90 (the same finished jobs, the same
conditional quantiles: the planned end is the `quantile` one of them) and how many finished jobs
it came from; else the single value the planner's fallback gives (a known deletion time, or the
prior's mean remaining time) or, for a job without a known start, no end, each with the reason.
Listing them changes no end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from advisor.forecast import predict_job_end
from advisor.history import RunningJob, running_jobs
from advisor.model import ClusterModel
from advisor.planner.observed import (
    DurationPrior,
    end_source,
    expected_end,
    known_deletion,
    now_of,
)


@dataclass(frozen=True)
class JobEndSettings:
    min_finished: int = 30  # finished jobs before learned ends replace the fallback
    min_similar: int = 5  # finished jobs that outlived a job's elapsed time, for its end
    min_group: int = 20  # ... of its own tenant and GPU count, to use that group alone
    quantile: float = 0.5  # of the remaining time: 0.5 the median, higher plans later
    by: tuple[str, ...] = ("tenant", "gpus")

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {self.quantile}")
        if self.min_finished < 1 or self.min_similar < 1 or self.min_group < 1:
            raise ValueError("min_finished, min_similar and min_group must be >= 1")


def predict(
    model: ClusterModel,
    finished: pd.DataFrame | None,
    settings: JobEndSettings = JobEndSettings(),
    prior: DurationPrior | None = None,
    running: Sequence[RunningJob] | None = None,
) -> tuple[dict[str, float], dict[str, Any]]:
    """({allocation id: expected end}, the document saying what was used); the mapping is empty
    below `min_finished` finished jobs. `running`: the model's jobs with the starts the history
    used for them (`JobLifetimes.running`: observed where the source gives none); default the
    source's own start times."""
    prior = prior or DurationPrior()
    now = now_of(model)
    every = running_jobs(model) if running is None else list(running)
    jobs = [j for j in every if j.start <= now]  # NaN (unknown) and future starts left out
    n_finished = 0 if finished is None else len(finished)
    doc: dict[str, Any] = {
        "finished_jobs": n_finished,
        "min_finished": settings.min_finished,
        "quantile": settings.quantile,
        "by": list(settings.by),
        "running_jobs": len(every),
        "unknown_start_jobs": len(every) - len(jobs),
        "predicted_jobs": 0,
        "by_group": 0,
        "predicted_allocations": 0,
        "median_duration_h": None,
        "median_censor_s": None,
        "reason": "",
    }
    if n_finished:
        assert finished is not None
        doc["median_duration_h"] = float(np.median(finished["duration_h"]))
        doc["median_censor_s"] = float(np.median(finished["censor_s"]))
    ends: dict[str, float] = {}
    learned: dict[tuple[str, str], tuple[list[float | None], int, str]] = {}
    unlearned: dict[tuple[str, str], str] = {}  # why a job with a known start has no learned end
    if n_finished < settings.min_finished:
        doc["reason"] = (
            f"{n_finished} finished job(s) seen, fewer than {settings.min_finished}: "
            "the planner's fallback is used"
        )
        few = f"{n_finished} finished job(s) seen, fewer than {settings.min_finished}"
        unlearned = {_key(job): few for job in jobs}
    elif jobs:
        assert finished is not None
        running = pd.DataFrame(
            {
                "job": range(len(jobs)),
                "elapsed_h": [(now - j.start) / 3600.0 for j in jobs],
                "tenant": [j.tenant for j in jobs],
                "gpus": [j.gpus for j in jobs],
            }
        )
        column = f"remaining_q{settings.quantile:g}"
        # the listed P50 and P90 come from the same call: each level is read off the same
        # tail independently, so asking for them changes no planned end
        levels = tuple(dict.fromkeys((settings.quantile, *LISTED_QUANTILES)))
        table = predict_job_end(
            running,
            finished[["duration_h", *[k for k in settings.by if k in finished.columns]]],
            by=settings.by,
            quantiles=levels,
            min_jobs=settings.min_group,
        )
        spread = zip(*(table[f"remaining_q{q:g}"].tolist() for q in LISTED_QUANTILES), strict=True)
        for index, n, basis, remaining, listed in zip(
            table["job"].tolist(),
            table["n"].tolist(),
            table["basis"].tolist(),
            table[column].tolist(),
            spread,
            strict=True,
        ):
            job = jobs[index]
            if n < settings.min_similar or not math.isfinite(remaining):
                unlearned[_key(job)] = (
                    f"only {n} finished job(s) outlived its {(now - job.start) / 3600.0:.1f} h, "
                    f"fewer than {settings.min_similar}"
                )
                continue
            end = now + max(0.0, remaining) * 3600.0
            for alloc in job.allocations:
                ends[alloc] = end
            learned[_key(job)] = (
                [now + max(0.0, r) * 3600.0 if math.isfinite(r) else None for r in listed],
                int(n),
                "all" if basis == "all" else "group",
            )
            doc["predicted_jobs"] += 1
            doc["by_group"] += basis != "all"
        doc["predicted_allocations"] = len(ends)
        reasons = []
        if len(jobs) > doc["predicted_jobs"]:
            reasons.append(
                f"{len(jobs) - doc['predicted_jobs']} running job(s) outlived all but fewer than "
                f"{settings.min_similar} finished jobs"
            )
        if doc["unknown_start_jobs"]:
            reasons.append(f"{doc['unknown_start_jobs']} running job(s) have no known start")
        if reasons:
            doc["reason"] = "; ".join(reasons) + ": they keep the planner's fallback"
    doc["source"] = end_source(model, prior, ends)
    doc["as_of"] = now
    doc["jobs"] = _listed(model, prior, now, every, ends, learned, unlearned)
    return ends, doc


LISTED_QUANTILES: tuple[float, float] = (0.5, 0.9)  # the P50 and P90 `jobs` lists


def _key(job: RunningJob) -> tuple[str, str]:
    return job.tenant, job.job


def _listed(
    model: ClusterModel,
    prior: DurationPrior,
    now: float,
    every: Sequence[RunningJob],
    ends: Mapping[str, float],
    learned: Mapping[tuple[str, str], tuple[list[float | None], int, str]],
    unlearned: Mapping[tuple[str, str], str],
) -> list[dict[str, Any]]:
    """One row per running job (unsorted): its learned P50/P90 where `predict` learned one,
    else the planner's fallback end (one value) or none, with the reason; `planned_end` is the
    end the reservations plan on (`expected_end` with `ends`: the latest of the job's tasks)."""
    allocs = model.allocations
    row_of: dict[str, int] = {}
    planned: list[float] = []  # the fallback per allocation; a learned end replaces it below
    known: list[bool] = []  # a known deletion time (after now) per allocation
    if len(learned) < len(every):  # as plain lists: read per job, a handful of tasks each
        row_of = {alloc: row for row, alloc in enumerate(allocs.id.tolist())}
        planned = expected_end(model, prior).tolist()
        known = known_deletion(model).tolist()
    prior_text = (
        f"the duration prior's mean remaining time (Pareto, median {prior.median_s / 3600:g} h)"
    )
    out = []
    for job in every:
        start = job.start if math.isfinite(job.start) else None
        row: dict[str, Any] = {
            "job": job.job,
            "tenant": job.tenant,
            "gpus": job.gpus,
            "nodes": sorted(job.nodes),
            "allocations": list(job.allocations),
            "start": start,
            "elapsed_h": (now - start) / 3600.0 if start is not None else None,
            "source": "none",
            "end": None,
            "end_p90": None,
            "planned_end": None,
            "similar_jobs": None,
            "basis": None,
            "reason": None,
        }
        if _key(job) in learned:
            (p50, p90), n, basis = learned[_key(job)]
            row.update(
                source="learned",
                end=p50,
                end_p90=p90,
                planned_end=max(ends[a] for a in job.allocations),
                similar_jobs=n,
                basis=basis,
            )
            out.append(row)
            continue
        rows = [row_of[a] for a in job.allocations if a in row_of]
        if rows:
            row["planned_end"] = max(planned[r] for r in rows)
        if start is None:
            why = "no known start (running when the service started, and the source gives none)"
        elif start > now:
            why = "its start is after the model's time"
        else:
            why = unlearned.get(_key(job), "no learned end")
        if rows and all(known[r] for r in rows):
            row.update(source="known", end=row["planned_end"])
            row["reason"] = f"{why}: the source's deletion time, one value (no P90)"
        elif start is not None and start <= now:
            row.update(source="prior", end=row["planned_end"])
            row["reason"] = f"{why}: {prior_text}, one value (no P90)"
        else:
            row["reason"] = (
                f"{why}: nothing to predict from; the planner assumes {prior_text} "
                "from the model's time"
            )
        out.append(row)
    return out


def outlook(ends: Mapping[str, float]) -> dict[str, Any] | None:
    """The planner's forecast argument (`recommend.as_outlook`), or None without ends."""
    return {"job_end": dict(ends)} if ends else None
