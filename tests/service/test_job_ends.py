"""Job ends learned from the service's own observations: finished jobs between consecutive
models (history), predicted ends for running jobs (service), the planner's reservations and the
loop using them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from advisor.forecast.job_ends import JobEndSettings, predict
from advisor.fragmentation import measures
from advisor.history import History, JobLifetimes
from advisor.ingest.live import LiveSim
from advisor.model import ClusterModel, ModelBuilder
from advisor.pipeline.stages import plans
from advisor.service.loop import AdvisorLoop, Config
from advisor.settings import Settings
from tests.conftest import add_nodes
from tests.service.test_metrics import samples

T0 = 1_000_000.0
H = 3600.0
STEP = 300.0  # seconds between observations
SPACING = 600.0  # a new 1-GPU job every 10 minutes
NO_SHAPES = Settings(measures=measures.Settings(shapes=()))  # the plan stage without goals


def duration_of(i: int) -> float:
    """About 2 h: 2 h +- up to 5 minutes, deterministic."""
    return 2 * H + ((i * 37) % 11 - 5) * 60.0


def world(t: float, *, hidden: tuple[str, ...] = (), pending: bool = True) -> ClusterModel:
    """Four 8-GPU nodes; tenant `t` starts a 1-GPU job every 10 min on n0..n2 (slot 5i mod 24,
    reused every 4 h), each lasting about 2 h; n3 stays empty; `big` (2 x 8 GPUs, tenant u)
    waits. Jobs in `hidden` are left out (a source that misses them)."""
    b = add_nodes(4, rack="r1", gpu_model="A100")
    i = 0
    while T0 + i * SPACING <= t:
        start = T0 + i * SPACING
        name = f"job{i}"
        if start <= t < start + duration_of(i) and name not in hidden:
            slot = (i * 5) % 24  # consecutive jobs on different nodes
            b.add_allocation(
                f"ns/{name}-0",
                num_gpu=1,
                node=f"n{slot // 8}",
                gpus=[slot % 8],
                job=name,
                tenant="t",
                start_time=start,
            )
        i += 1
    if pending:
        for task in range(2):
            b.add_allocation(f"big{task}", num_gpu=8, job="big", tenant="u", priority=5)
    return b.build(timestamp=t)


def timeline(hours: float) -> list[ClusterModel]:
    return [world(T0 + k * STEP) for k in range(int(hours * H / STEP) + 1)]


@pytest.fixture(scope="module")
def watched() -> History:
    history = History()
    history.extend(timeline(10))
    return history


def test_finished_jobs_are_learned_between_consecutive_models(watched) -> None:
    frame = watched.finished_jobs()
    # jobs 0..47 end (about 2 h after starting every 10 min) before the last look at 10 h
    ended = [i for i in range(60) if T0 + i * SPACING + duration_of(i) <= T0 + 10 * H]
    assert sorted(frame["job"]) == sorted(f"job{i}" for i in ended)
    assert (frame["tenant"] == "t").all() and (frame["gpus"] == 1.0).all()
    assert (frame["censor_s"] == STEP).all()  # the end lies between two looks 5 min apart
    for row in frame.itertuples():
        truth = duration_of(int(row.job.removeprefix("job"))) / H
        assert abs(row.duration_h - truth) <= STEP / 2 / H + 1e-9  # midpoint: half a gap


def test_running_jobs_get_ends_from_their_elapsed_time(watched) -> None:
    now = T0 + 10 * H
    model = world(now)
    ends, doc = predict(model, watched.finished_jobs())
    assert doc["finished_jobs"] >= 30 and doc["source"] == "forecast job ends"
    allocs = model.allocations
    starts = dict(zip(allocs.id.tolist(), allocs.start_time.tolist(), strict=True))
    running = [a for a in starts if not math.isnan(starts[a])]
    assert len(ends) >= len(running) - 3  # only jobs older than nearly every finished one lack
    assert doc["predicted_allocations"] == len(ends) and doc["running_jobs"] == len(running)
    elapsed = sorted(now - starts[a] for a in ends)
    assert elapsed[0] < 0.5 * H and elapsed[-1] > 1.5 * H  # young and old jobs alike
    for alloc, end in ends.items():
        # about start + 2 h whatever the elapsed time: not now + 2 h
        assert abs(end - (starts[alloc] + 2 * H)) <= 10 * 60, alloc
    # a later quantile plans later
    late, _ = predict(model, watched.finished_jobs(), JobEndSettings(quantile=0.9))
    assert all(late[a] >= ends[a] for a in ends)


def test_below_the_minimum_the_planner_keeps_its_prior() -> None:
    history = History()
    history.extend(timeline(3))  # about 6 jobs finished by 3 h
    model = world(T0 + 3 * H)
    ends, doc = predict(model, history.finished_jobs())
    assert ends == {} and 0 < doc["finished_jobs"] < 30
    assert "duration prior" in doc["source"] and "fewer than 30" in doc["reason"]
    recs = plans(model, NO_SHAPES, [], history.finished_jobs())
    reserve = [a for a in recs["actions"] if a["kind"] == "reserve"]
    assert reserve and all("duration prior" in a["summary"] for a in reserve)
    assert recs["job_ends"]["source"] == doc["source"]


def test_reservations_plan_on_the_learned_ends(watched) -> None:
    now = T0 + 10 * H
    model = world(now)
    finished = watched.finished_jobs()
    learned = plans(model, NO_SHAPES, [], finished)
    prior = plans(model, NO_SHAPES, [], None)
    [plan] = [p for p in learned["plans"] if p["method"] == "reserve"]
    [before] = [p for p in prior["plans"] if p["method"] == "reserve"]
    reserve = [a for a in learned["actions"] if a["kind"] == "reserve"]
    assert reserve and all("forecast job ends" in a["summary"] for a in reserve)
    assert plan["ends_from"] == "forecast job ends"
    assert learned["job_ends"]["source"] == "forecast job ends"
    # the job starts when the last 1-GPU job on its second node ends: about start + 2 h
    ends, _ = predict(model, finished)
    starts = {
        a: s
        for a, s, n in zip(
            model.allocations.id.tolist(),
            model.allocations.start_time.tolist(),
            model.allocations.node.tolist(),
            strict=True,
        )
        if n >= 0
    }
    node_of = {
        a: str(model.nodes.name[n])
        for a, n in zip(model.allocations.id.tolist(), model.allocations.node.tolist(), strict=True)
        if n >= 0
    }
    chosen = [n for n in plan["nodes"] if n != "n3"]
    assert len(chosen) == 1
    on_node = [a for a in starts if node_of[a] == chosen[0]]
    latest = max(ends.get(a, math.inf) for a in on_node)
    assert plan["start_at"] == pytest.approx(latest)
    assert abs(latest - (max(starts[a] for a in on_node) + 2 * H)) <= 10 * 60
    # the Pareto prior (median 4 h) expects the young jobs to run far longer
    assert plan["start_at"] < before["start_at"] - H


def test_a_job_that_vanishes_and_comes_back_is_not_finished() -> None:
    jobs = JobLifetimes()
    jobs.observe(world(T0 + 100.0))
    jobs.observe(world(T0 + 400.0, hidden=("job0",)))  # the source missed it once
    assert [r.job for r in jobs.finished()] == ["job0"]
    seen = jobs.frame()
    seen.loc[0, "job"] = "edited"  # each caller gets its own copy of the cached frame
    assert jobs.frame()["job"].tolist() == ["job0"]
    jobs.observe(world(T0 + 700.0))  # back, with the same start: it never finished
    assert jobs.finished() == [] and jobs.counts()["withdrawn"] == 1
    assert jobs.frame().empty  # the withdrawal rebuilt it
    t = T0 + 700.0
    while t < T0 + duration_of(0) + STEP:
        t += STEP
        jobs.observe(world(t))
    [record] = [r for r in jobs.finished() if r.job == "job0"]
    assert abs(record.duration_s - duration_of(0)) <= STEP / 2


def test_restarts_reused_ids_and_missing_nodes() -> None:
    def one(t: float, start: float, node: str = "n0", nodes: tuple[str, ...] = ("n0", "n1")):
        b = add_nodes(nodes, 1)
        if start == start:  # NaN: no job
            b.add_allocation("pod", num_gpu=1, node=node, gpus=[0], job="j", start_time=start)
        return b.build(timestamp=t)

    nan = math.nan
    jobs = JobLifetimes()
    jobs.observe(one(T0, T0 - 600))
    jobs.observe(one(T0 + 60, T0 + 30))  # same name, started after its last sighting: a restart
    [first] = jobs.finished()
    assert first.start == T0 - 600 and first.gone_at == T0 + 30  # ended by the new start
    jobs.observe(one(T0 + 120, nan, nodes=("n1",)))  # its node is not observed: no conclusion
    assert len(jobs.finished()) == 1
    jobs.observe(one(T0 + 180, nan))  # node back, job gone: finished
    assert [r.start for r in jobs.finished()] == [T0 - 600, T0 + 30]
    assert jobs.finished()[1].last_seen == T0 + 60
    # the name is reused later by an unrelated job: a new record, the old ones stay
    jobs.observe(one(T0 + 240, T0 + 200))
    jobs.observe(one(T0 + 300, nan))
    assert len(jobs.finished()) == 3
    # a start after the last sighting (a clock ahead of the model's): not positive, dropped
    jobs.observe(one(T0 + 360, T0 + 400))
    jobs.observe(one(T0 + 370, nan))
    assert len(jobs.finished()) == 3 and jobs.counts()["dropped"] == 1
    # an allocation without a start time that appears between two looks started between them
    b = ModelBuilder()
    b.add_node("n0")
    b.add_gpu("n0", 0)
    b.add_allocation("x", num_gpu=1, node="n0", gpus=[0])
    jobs.observe(b.build(timestamp=T0 + 400))
    [x] = jobs.running(T0 + 400)
    assert x.job == "x" and x.start == T0 + 385 and x.allocations == ("x",)
    assert jobs.running(T0 + 399) is None  # not the latest look


def test_the_record_is_bounded() -> None:
    jobs = JobLifetimes(max_finished=5)
    for k in range(60):
        jobs.observe(world(T0 + k * STEP, pending=False))
    kept = jobs.finished()
    assert len(kept) == 5 and len(jobs) == 5
    assert kept[-1].end == max(r.end for r in kept)  # the latest are kept


def test_the_loop_passes_learned_ends_to_the_planner(scripted) -> None:
    models = timeline(10)
    loop = AdvisorLoop("scripted", scripted(*models[-3:]), Config())
    loop.seed_history(models[:-3])
    for _ in range(3):
        state = loop.run_once()
    recs = state.results.recommendations
    assert recs["stale"] is False and recs["job_ends"]["source"] == "forecast job ends"
    assert recs["job_ends"]["finished_jobs"] == len(loop.history.finished_jobs()) >= 30
    # the waiting job's reservation (consolidation plans for the 2x8 shape reserve too)
    reserve = [a for a in recs["actions"] if a["goal"] == "reserve 2x8 GPUs for big"]
    assert reserve and all("forecast job ends" in a["summary"] for a in reserve)
    # and /metrics says how many jobs were learned from and how many running ends are learned
    page = loop.current_page().body.decode()
    [finished] = [s for s in samples(page) if s.name == "gpu_advisor_job_end_finished_jobs"]
    assert finished.value == recs["job_ends"]["finished_jobs"]
    running = {
        s.labels["basis"]: s.value
        for s in samples(page)
        if s.name == "gpu_advisor_job_end_running_jobs"
    }
    assert running["learned"] == recs["job_ends"]["predicted_jobs"] > 0
    assert running["learned"] + running["fallback"] == recs["job_ends"]["running_jobs"]


def test_the_simulated_backfill_teaches_job_ends() -> None:
    clock = lambda: 0.0  # noqa: E731
    source = LiveSim("sim:a100-16x8?nodes=4", clock=clock)
    loop = AdvisorLoop("sim", source, Config(settings=Settings(horizons_h=(1,))))
    loop.seed_history(source.backfill(48 * H))
    learned = len(loop.history.finished_jobs())
    assert learned > 0
    state = loop.run_once()
    doc = state.results.recommendations["job_ends"]
    assert doc["finished_jobs"] >= learned
    assert doc["median_censor_s"] == pytest.approx(H)  # hourly backfill: ends within an hour
    expected = "forecast job ends" if doc["predicted_allocations"] else "duration prior"
    assert expected in doc["source"]


def test_without_start_times_the_starts_are_observed(scripted) -> None:
    """Exporter scrapes and Prometheus give no start times: a job that appears while the
    service watches started between two looks; one already running at the first look is never
    recorded and keeps the prior."""

    def blind(model: ClusterModel) -> ClusterModel:
        allocs = model.allocations
        allocs.start_time = np.full(len(allocs), np.nan)
        return model

    models = [blind(m) for m in timeline(10)]
    history = History()
    history.extend(models)
    frame = history.finished_jobs()
    first = {
        a
        for a, n in zip(models[0].allocations.job.tolist(), models[0].allocations.node, strict=True)
        if n >= 0
    }
    assert first and not first & set(frame["job"])  # running at the first look: start unknown
    assert history.jobs.counts()["unknown_start"] == len(first)
    assert len(frame) >= 30 and (frame["start_gap_s"] == STEP).all()
    for row in frame.itertuples():
        truth = duration_of(int(row.job.removeprefix("job"))) / H
        assert abs(row.duration_h - truth) <= STEP / H + 1e-9  # half a gap at each end
    # the loop predicts from the observed starts
    loop = AdvisorLoop("scripted", scripted(*models[-2:]), Config())
    loop.seed_history(models[:-2])
    loop.run_once()
    state = loop.run_once()
    doc = state.results.recommendations["job_ends"]
    assert doc["source"] == "forecast job ends" and doc["unknown_start_jobs"] == 0
    assert doc["predicted_allocations"] >= doc["running_jobs"] - 3
    reserve = [
        a
        for a in state.results.recommendations["actions"]
        if a["goal"] == "reserve 2x8 GPUs for big"
    ]
    assert reserve and all("forecast job ends" in a["summary"] for a in reserve)
    # a blip without start times: missing from one look only, the record is withdrawn
    jobs = JobLifetimes()
    for t, hidden in ((1800.0, ()), (2100.0, ()), (2400.0, ()), (2700.0, ("job4",))):
        jobs.observe(blind(world(T0 + t, hidden=hidden)))  # job4 appears at 2400
    assert [r.job for r in jobs.finished()] == ["job4"]
    jobs.observe(blind(world(T0 + 3000.0)))
    assert jobs.counts()["withdrawn"] == 1 and jobs.finished() == []
    [job4] = [j for j in jobs.running(T0 + 3000.0) if j.job == "job4"]
    assert job4.start == T0 + 2250.0  # the observed start survives the blip


def test_a_reservations_summary_label_does_not_change_as_time_passes() -> None:
    """The summary is the `summary` label of gpu_advisor_action_info: the same reservation ten
    minutes later must keep its label (a new value is a new series); its reason, in the API,
    still says when the job starts."""
    import dataclasses

    model = world(T0 + 3 * H)
    later = dataclasses.replace(model, timestamp=model.timestamp + 600.0, _cache={})
    docs = [plans(m, NO_SHAPES, []) for m in (model, later)]
    reserve = [[a for a in d["actions"] if a["kind"] == "reserve"] for d in docs]
    assert reserve[0] and len(reserve[0]) == len(reserve[1])
    assert [a["summary"] for a in reserve[0]] == [a["summary"] for a in reserve[1]]
    assert all("duration prior" in a["summary"] for a in reserve[0])
    reasons = [
        [a["reason"] for p in d["plans"] if p["method"] == "reserve" for a in p["actions"]]
        for d in docs
    ]
    assert reasons[0] != reasons[1] and all("starts in" in r for r in reasons[0])
