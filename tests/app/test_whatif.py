"""What-if page: fits now (the advisor's count), else the cheapest checked plan and the wait
without moving anything, with where the job-end estimate comes from."""

from __future__ import annotations

from advisor.fragmentation import measures
from advisor.ingest.sources import load_source
from advisor.pipeline import Settings
from advisor.pipeline import queries as Q
from tests.app.conftest import frame_with, metrics, open_app, served

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
    answer = Q.whatif(load_source(SOURCE), Settings(), 8, 5)
    assert answer.fits_now == 0 and answer.plan is not None and answer.plan.feasible
    assert at.warning[0].value.startswith("No:")
    shown = metrics(at)
    assert shown["Migrations"] == str(answer.plan.migrations)
    assert shown["GPU-hours lost"] == f"{answer.plan.cost.gpu_hours:.2f}"
    assert len(frame_with(at, "why")) == len(answer.plan.actions)
    assert answer.wait is not None
    assert shown["Starts in"] == Q.hours(answer.wait.extra["starts_in_s"])


def test_a_job_no_plan_can_start_now_says_when_it_would() -> None:
    at = _ask(6)
    answer = Q.whatif(load_source(SOURCE), Settings(), 8, 6)
    assert not answer.plan.feasible
    assert any(answer.plan.reason in w.value for w in at.warning)
    assert not at.error  # an impossible plan is an answer, not an error
    assert answer.wait is not None and answer.wait.feasible
    text = " ".join(m.value for m in at.markdown)
    assert answer.wait.extra["ends_from"] in text  # the estimate says what it rests on
    assert metrics(at)["Starts in"] == Q.hours(answer.wait.extra["starts_in_s"])


def test_the_wait_rests_on_the_job_ends_the_service_learns() -> None:
    """Two simulated days in, enough jobs have been seen to finish: the wait is planned on the
    ends the service's `predict` learns from the same history, and the page says so."""
    from advisor.forecast.job_ends import JobEndSettings

    source = "sim:a100-16x8?t=2d"
    view = served(source)  # the plan stage's learned ends, as /api/job-ends lists them
    model, ends = view.model, view.planned_ends()
    doc = view.recommendations.job_ends.model_dump()
    assert ends and doc["finished_jobs"] >= JobEndSettings().min_finished
    at = open_app(source, PAGE)  # 2 x 8 GPUs: cannot start now
    answer = Q.whatif(model, Settings(), 8, 2, job_end=ends)
    assert answer.fits_now == 0 and answer.wait is not None and answer.wait.feasible
    assert metrics(at)["Starts in"] == Q.hours(answer.wait.extra["starts_in_s"])
    fallback = Q.whatif(model, Settings(), 8, 2).wait
    assert fallback is not None
    assert metrics(at)["Starts in"] != Q.hours(fallback.extra["starts_in_s"])
    text = " ".join(m.value for m in at.markdown)
    assert f"forecast job ends learned from {doc['finished_jobs']} finished jobs" in text


def test_a_snapshot_without_a_clock_shows_hours_not_1970_dates() -> None:
    """A snapshot with no timestamp counts its times from 0: the wait is hours after the
    snapshot's time, never a date in 1970 (a snapshot with a timestamp shows real dates)."""
    at = open_app("examples/seed-16x8-a100.json", PAGE)
    at.number_input(key="wi_nodes").set_value(7).run()  # 7 x 8: waits for running jobs
    assert not at.exception
    texts = [m.value for m in at.markdown] + [m.help or "" for m in at.metric]
    assert any("h after the snapshot's time" in t for t in texts), texts
    assert not any("1970" in t for t in texts)
    dated = open_app("examples/seed-mixed-fleet.json")  # timestamp 2026-01-01
    assert any("at 2026-01-01" in c.value for c in dated.caption)
