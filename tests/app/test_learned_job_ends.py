"""The app's predicted free GPUs per node, What-if start times and Actions plans rest on the job
ends the advisor's plan stage learned from the same history (`advisor.forecast.job_ends.predict`),
read from the published view (`View.planned_ends`, the `/api/job-ends` list), and keep the
planner's fallback, saying so, where the plan stage does."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.app import forecasts
from advisor.forecast.job_ends import JobEndSettings, predict
from advisor.history import History
from advisor.pipeline import Pipeline, Settings, View
from advisor.pipeline import queries as Q
from advisor.planner.observed import end_source
from advisor.results import jsonable
from advisor.settings import HORIZONS_H
from tests.service.conftest import ScriptedSource
from tests.service.test_job_ends import timeline


def published(hours: float) -> tuple[View, History]:
    """The view the pipeline publishes after watching the service tests' world for `hours` (a
    1-GPU job of about 2 h every 10 minutes, one look every 5 minutes; `big`, 2 x 8 GPUs, waits
    while n3 alone is empty), and its history before that last run."""
    models = timeline(hours)
    pipeline = Pipeline("scripted", ingest=ScriptedSource(models[-1]))
    pipeline.seed_history(models[:-1])
    before = History()
    before.extend(models[:-1])
    return View.of(pipeline.run_once()), before


def predicted(view: View, history: History) -> tuple[dict[str, float], dict]:
    """What `predict` gives on that history for the view's model (the plan stage's call)."""
    model = view.model
    history.append(model)
    running = history.jobs.running(model.timestamp)
    return predict(model, history.finished_jobs(), JobEndSettings(), running=running)


@pytest.fixture(scope="module")
def learned() -> tuple[View, History]:
    return published(10)  # 48 finished jobs: more than min_finished (30)


@pytest.fixture(scope="module")
def unlearned() -> tuple[View, History]:
    return published(2.5)  # a handful of finished jobs: fewer than min_finished


def test_the_apps_job_ends_are_the_plan_stages(learned) -> None:
    view, history = learned
    ends, doc = predicted(view, history)
    assert view.planned_ends() == ends and len(ends) > 0
    served = view.recommendations.job_ends.model_dump()
    assert served == {k: v for k, v in doc.items() if k != "jobs"}
    assert served["finished_jobs"] >= JobEndSettings().min_finished
    assert served["source"] == "forecast job ends"
    text = forecasts.job_ends_text(served)
    assert f"forecast job ends learned from {served['finished_jobs']} finished jobs" in text
    assert f"for {served['predicted_jobs']} of {served['running_jobs']} running jobs" in text


def test_node_free_times_use_the_learned_ends(learned) -> None:
    view, _ = learned
    model, ends = view.model, view.planned_ends()
    free = Q.free_gpus_by_node(model, ends)
    # every GPU whose allocations all end (by the plan stage's ends) within h hours is counted
    now = model.timestamp
    places = model.placements
    alloc_end = np.array([ends[a] for a in model.allocations.id[places.alloc]])
    for h in HORIZONS_H:
        busy = np.zeros(len(model.gpus), dtype=bool)
        busy[places.gpu[alloc_end > now + h * 3600.0]] = True
        expected = np.bincount(model.gpus.node, weights=~busy, minlength=len(model.nodes))
        assert free[f"free within {h} h"].tolist() == expected.astype(int).tolist()
    fallback = Q.free_gpus_by_node(model, {})
    assert not free.equals(fallback)  # the learned ends are not the duration prior's


def test_whatif_starts_when_the_served_reservation_would(learned) -> None:
    """`big` (2 x 8 GPUs) waits in this world: the served reservation for it, planned on its
    learned ends, starts when the What-if says a 2 x 8 job would start without moving anything."""
    view, _ = learned
    model, ends = view.model, view.planned_ends()
    plans = [p.model_dump(by_alias=True, exclude_unset=True) for p in view.recommendations.plans]
    (reservation,) = [p for p in plans if p["method"] == "reserve" and p["feasible"]]
    assert reservation["job"] == "big"
    answer = Q.whatif(model, Settings(), 8, 2, job_end=ends)
    assert answer.fits_now == 0 and answer.wait is not None and answer.wait.feasible
    assert answer.wait.extra["ends_from"] == reservation["ends_from"]
    assert answer.wait.extra["ends_from"] == "forecast job ends"
    assert answer.wait.extra["start_at"] == pytest.approx(reservation["start_at"])
    fallback = Q.whatif(model, Settings(), 8, 2).wait
    assert fallback is not None
    assert fallback.extra["start_at"] != pytest.approx(answer.wait.extra["start_at"])


def test_without_enough_finished_jobs_the_fallback_stays_and_says_so(unlearned) -> None:
    view, history = unlearned
    model, ends = view.model, view.planned_ends()
    _, doc = predicted(view, history)
    served = view.recommendations.job_ends.model_dump()
    assert ends == {} and served == {k: v for k, v in doc.items() if k != "jobs"}
    assert 0 < served["finished_jobs"] < JobEndSettings().min_finished
    text = forecasts.job_ends_text(served)
    assert text.startswith(f"**{end_source(model)}**")
    assert "duration prior" in text and "learned" not in text
    assert f"fewer than {JobEndSettings().min_finished}: the planner's fallback is used" in text
    assert Q.free_gpus_by_node(model, ends).equals(Q.free_gpus_by_node(model, {}))
    wait = Q.whatif(model, Settings(), 8, 2, job_end=ends).wait
    before = Q.whatif(model, Settings(), 8, 2).wait
    assert wait is not None and before is not None
    assert wait.extra["start_at"] == before.extra["start_at"]
    assert wait.extra["ends_from"] == end_source(model)


def test_an_empty_history_keeps_the_fallback() -> None:
    """A single instant (a snapshot, a sim at t=0): no finished job, nothing learned."""
    view = View.of(Pipeline("one", ingest=ScriptedSource(timeline(1)[-1])).run_once())
    doc = view.recommendations.job_ends.model_dump()
    assert view.planned_ends() == {} and doc["finished_jobs"] == 0
    assert doc["source"] == end_source(view.model)
    assert "0 finished job(s) seen" in forecasts.job_ends_text(doc)


def test_whatif_learns_no_ends_for_a_job_that_fits_now(learned) -> None:
    """A job that starts now needs no job ends: they are not even asked for."""
    view, _ = learned

    def never() -> dict[str, float]:
        raise AssertionError("job ends asked for a job that fits now")

    answer = Q.whatif(view.model, Settings(), 8, 1, job_end=never)  # n3 is empty
    assert answer.fits_now == 1 and answer.wait is None


def test_the_actions_pages_reservations_are_the_served_ones(learned) -> None:
    """Planned again on the view (the Actions page with a policy file), the other kinds
    (reservations for the waiting `big` job) rest on the learned ends: the served reservation
    plans, not the fallback's."""
    view, _ = learned
    model = view.model
    app = Q.plan_goals(model, Settings(), view.planned_ends(), others=True)
    fallback = Q.plan_goals(model, Settings(), {}, others=True)
    served = [p.model_dump(by_alias=True, exclude_unset=True) for p in view.recommendations.plans]
    reserve = [jsonable(p.to_dict()) for p in app if p.goal.startswith("reserve")]
    assert reserve and reserve == [p for p in served if p["goal"].startswith("reserve")]
    assert reserve != [jsonable(p.to_dict()) for p in fallback if p.goal.startswith("reserve")]
