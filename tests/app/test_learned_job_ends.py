"""The app's predicted free GPUs per node and What-if start times plan on the job ends the advisor
service learns from the same history (`advisor.forecast.job_ends.predict`), and keep the planner's
fallback, saying so, where the service does."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.app import forecasts, plans
from advisor.forecast.job_ends import JobEndSettings, predict
from advisor.fragmentation import measures
from advisor.history import History
from advisor.model import ClusterModel
from advisor.pipeline.stages import plans as plan_stage
from advisor.planner.constraints import Policy
from advisor.planner.observed import end_source
from advisor.settings import Settings
from tests.service.test_job_ends import timeline


def watched(hours: float) -> tuple[ClusterModel, History]:
    """The latest model of the service tests' world and the history that watched it for
    `hours` (a 1-GPU job of about 2 h every 10 minutes, one look every 5 minutes; `big`, 2 x 8
    GPUs, waits while n3 alone is empty)."""
    models = timeline(hours)
    history = History()
    history.extend(models)
    return models[-1], history


def service_job_ends(model: ClusterModel, history: History) -> tuple[dict[str, float], dict]:
    """What the service's plan stage computes for this model and history (`AdvisorLoop._run`:
    `recommend_service(..., history.finished_jobs(), config.job_ends, history.jobs.running(t))`,
    which calls `predict` so): the ends, and the document `recommend_service` serves."""
    finished, running = history.finished_jobs(), history.jobs.running(model.timestamp)
    ends, _ = predict(model, finished, JobEndSettings(), running=running)
    settings = Settings(measures=measures.Settings(shapes=()))
    recs = plan_stage(model, settings, [], finished, running)
    return ends, recs


@pytest.fixture(scope="module")
def learned() -> tuple[ClusterModel, History]:
    return watched(10)  # 48 finished jobs: more than min_finished (30)


@pytest.fixture(scope="module")
def unlearned() -> tuple[ClusterModel, History]:
    return watched(2.5)  # a handful of finished jobs: fewer than min_finished


def test_the_apps_job_ends_are_the_services(learned) -> None:
    model, history = learned
    ends, doc = forecasts.learned_job_ends(model, history)
    service_ends, recs = service_job_ends(model, history)
    assert ends == service_ends and len(ends) > 0
    assert doc == recs["job_ends"]
    assert doc["finished_jobs"] >= JobEndSettings().min_finished
    assert doc["source"] == "forecast job ends"
    text = forecasts.job_ends_text(doc)
    assert f"forecast job ends learned from {doc['finished_jobs']} finished jobs" in text
    assert f"for {doc['predicted_jobs']} of {doc['running_jobs']} running jobs" in text


def test_node_free_times_use_the_learned_ends(learned) -> None:
    model, history = learned
    service_ends, _ = service_job_ends(model, history)
    ends, _ = forecasts.learned_job_ends(model, history)
    free = forecasts.node_free_times(model, ends)
    # every GPU whose allocations all end (by the service's ends) within h hours is counted
    now = model.timestamp
    places = model.placements
    alloc_end = np.array([service_ends[a] for a in model.allocations.id[places.alloc]])
    for h in forecasts.FREE_IN_H:
        busy = np.zeros(len(model.gpus), dtype=bool)
        busy[places.gpu[alloc_end > now + h * 3600.0]] = True
        expected = np.bincount(model.gpus.node, weights=~busy, minlength=len(model.nodes))
        assert free[f"free within {h} h"].tolist() == expected.astype(int).tolist()
    fallback = forecasts.node_free_times(model)
    assert not free.equals(fallback)  # the learned ends are not the duration prior's


def test_whatif_starts_when_the_services_reservation_would(learned) -> None:
    """`big` (2 x 8 GPUs) waits in this world: the service's reservation for it, planned on its
    learned ends, starts when the What-if says a 2 x 8 job would start without moving anything."""
    model, history = learned
    ends, _ = forecasts.learned_job_ends(model, history)
    _, recs = service_job_ends(model, history)
    (reservation,) = [p for p in recs["plans"] if p["method"] == "reserve" and p["feasible"]]
    assert reservation["job"] == "big"
    answer = plans.whatif(model, 8, 2, job_end=ends)
    assert answer.fits_now == 0 and answer.wait is not None and answer.wait.feasible
    assert answer.wait.extra["ends_from"] == reservation["ends_from"]
    assert answer.wait.extra["ends_from"] == "forecast job ends"
    assert answer.wait.extra["start_at"] == pytest.approx(reservation["start_at"])
    fallback = plans.whatif(model, 8, 2).wait
    assert fallback is not None
    assert fallback.extra["start_at"] != pytest.approx(answer.wait.extra["start_at"])


def test_without_enough_finished_jobs_the_fallback_stays_and_says_so(unlearned) -> None:
    model, history = unlearned
    ends, doc = forecasts.learned_job_ends(model, history)
    _, recs = service_job_ends(model, history)
    assert ends == {} and doc == recs["job_ends"]
    assert 0 < doc["finished_jobs"] < JobEndSettings().min_finished
    text = forecasts.job_ends_text(doc)
    assert text.startswith(f"**{end_source(model)}**")
    assert "duration prior" in text and "learned" not in text
    assert f"fewer than {JobEndSettings().min_finished}: the planner's fallback is used" in text
    free = forecasts.node_free_times(model, ends)
    assert free.equals(forecasts.node_free_times(model))
    wait = plans.whatif(model, 8, 2, job_end=ends).wait
    before = plans.whatif(model, 8, 2).wait
    assert wait is not None and before is not None
    assert wait.extra["start_at"] == before.extra["start_at"]
    assert wait.extra["ends_from"] == end_source(model)


def test_an_empty_history_keeps_the_fallback() -> None:
    """A single instant (a snapshot, a sim at t=0): no finished job, nothing learned."""
    model = timeline(1)[-1]
    ends, doc = forecasts.learned_job_ends(model, History())
    assert ends == {} and doc["finished_jobs"] == 0
    assert doc["source"] == end_source(model)
    assert "0 finished job(s) seen" in forecasts.job_ends_text(doc)


def test_whatif_learns_no_ends_for_a_job_that_fits_now(learned) -> None:
    """Learning the ends can mean simulating a fleet's past: a job that starts now needs none."""
    model, _ = learned

    def never() -> dict[str, float]:
        raise AssertionError("job ends asked for a job that fits now")

    answer = plans.whatif(model, 8, 1, job_end=never)  # n3 is empty
    assert answer.fits_now == 1 and answer.wait is None


def test_the_actions_pages_reservations_are_the_services(learned) -> None:
    """The Actions page's other kinds (reservations for the waiting `big` job) plan on the
    learned ends: the same reservation plans as the service's, not the fallback's."""
    model, history = learned
    ends, _ = forecasts.learned_job_ends(model, history)
    _, recs = service_job_ends(model, history)
    app = plans.recommendations(model, Policy(), "", others=True, job_end=ends)
    fallback = plans.recommendations(model, Policy(), "", others=True)
    reserve = [p.to_dict() for p in app if p.goal.startswith("reserve")]
    assert reserve and reserve == [p for p in recs["plans"] if p["goal"].startswith("reserve")]
    assert reserve != [p.to_dict() for p in fallback if p.goal.startswith("reserve")]
