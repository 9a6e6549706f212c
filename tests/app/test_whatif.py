"""What-if page: fits now (the advisor's count), else the cheapest checked plan and the wait
without moving anything, with where the job-end estimate comes from."""

from __future__ import annotations

from advisor.app import plans
from advisor.fragmentation import measures
from advisor.ingest.sources import load_source
from tests.app.conftest import frame_with, metrics, open_app

PAGE = "views/whatif.py"
SOURCE = "sim:a100-16x8"


def _ask(nodes: int, gpus: int = 8):
    at = open_app(SOURCE, PAGE)
    at.number_input(key="wi_gpus").set_value(gpus)
    at.number_input(key="wi_nodes").set_value(nodes).run()
    assert not at.exception
    return at


def test_a_job_that_fits_now() -> None:
    at = _ask(2)
    fits = measures.jobs_that_fit(load_source(SOURCE), measures.Shape(8, tasks=2))
    assert fits > 0
    assert at.success[0].value.startswith(f"Yes: {fits} job(s) of 2 x 8 GPUs")


def test_a_job_that_needs_migrations() -> None:
    at = _ask(5)
    answer = plans.whatif(load_source(SOURCE), 8, 5)
    assert answer.fits_now == 0 and answer.plan is not None and answer.plan.feasible
    assert at.warning[0].value.startswith("No:")
    shown = metrics(at)
    assert shown["Migrations"] == str(answer.plan.migrations)
    assert shown["GPU-hours lost"] == f"{answer.plan.cost.gpu_hours:.2f}"
    assert len(frame_with(at, "why")) == len(answer.plan.actions)
    assert answer.wait is not None
    assert shown["Starts in"] == plans.hours(answer.wait.extra["starts_in_s"])


def test_a_job_no_plan_can_start_now_says_when_it_would() -> None:
    at = _ask(6)
    answer = plans.whatif(load_source(SOURCE), 8, 6)
    assert not answer.plan.feasible
    assert any(answer.plan.reason in w.value for w in at.warning)
    assert not at.error  # an impossible plan is an answer, not an error
    assert answer.wait is not None and answer.wait.feasible
    text = " ".join(m.value for m in at.markdown)
    assert answer.wait.extra["ends_from"] in text  # the estimate says what it rests on
    assert metrics(at)["Starts in"] == plans.hours(answer.wait.extra["starts_in_s"])


def test_the_wait_rests_on_the_job_ends_the_service_learns() -> None:
    """Two simulated days in, enough jobs have been seen to finish: the wait is planned on the
    ends the service's `predict` learns from the same history, and the page says so."""
    from advisor.app import data
    from advisor.forecast.job_ends import JobEndSettings, predict

    source = "sim:a100-16x8?t=2d"
    model, history = load_source(source), data.sim_trend(source)
    running = history.jobs.running(model.timestamp)
    ends, doc = predict(model, history.finished_jobs(), JobEndSettings(), running=running)
    assert ends and doc["finished_jobs"] >= JobEndSettings().min_finished
    at = open_app(source, PAGE)  # 2 x 8 GPUs: cannot start now
    answer = plans.whatif(model, 8, 2, job_end=ends)
    assert answer.fits_now == 0 and answer.wait is not None and answer.wait.feasible
    assert metrics(at)["Starts in"] == plans.hours(answer.wait.extra["starts_in_s"])
    fallback = plans.whatif(model, 8, 2).wait
    assert fallback is not None
    assert metrics(at)["Starts in"] != plans.hours(fallback.extra["starts_in_s"])
    text = " ".join(m.value for m in at.markdown)
    assert f"forecast job ends learned from {doc['finished_jobs']} finished jobs" in text
