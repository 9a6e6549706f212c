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
from advisor.planner.observed import DurationPrior, end_source, now_of


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
    if n_finished < settings.min_finished:
        doc["reason"] = (
            f"{n_finished} finished job(s) seen, fewer than {settings.min_finished}: "
            "the planner's fallback is used"
        )
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
        table = predict_job_end(
            running,
            finished[["duration_h", *[k for k in settings.by if k in finished.columns]]],
            by=settings.by,
            quantiles=(settings.quantile,),
            min_jobs=settings.min_group,
        )
        for index, n, basis, remaining in zip(
            table["job"].tolist(),
            table["n"].tolist(),
            table["basis"].tolist(),
            table[column].tolist(),
            strict=True,
        ):
            if n < settings.min_similar or not math.isfinite(remaining):
                continue
            end = now + max(0.0, remaining) * 3600.0
            for alloc in jobs[index].allocations:
                ends[alloc] = end
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
    return ends, doc


def outlook(ends: Mapping[str, float]) -> dict[str, Any] | None:
    """The planner's forecast argument (`recommend.as_outlook`), or None without ends."""
    return {"job_end": dict(ends)} if ends else None
