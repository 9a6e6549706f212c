"""The run loop: stages, stale marking, errors by stage, health, the live simulated source."""

from __future__ import annotations

import pytest

from advisor.ingest.live import LiveSim, make_ingest
from advisor.ingest.sources import SourceError
from advisor.pipeline import stages
from advisor.service import loop as loop_module
from advisor.service.loop import AdvisorLoop, Config
from advisor.settings import Settings


def lines(loop: AdvisorLoop, name: str) -> list[str]:
    return [
        line
        for line in loop.current_page().body.decode().splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    ]


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_source_failing_after_a_good_run_keeps_results_and_marks_them_stale(islands, scripted):
    source = scripted(islands, "http://x:9835/metrics: connection refused", islands)
    clock = Clock()
    loop = AdvisorLoop("snap", source, Config(interval_s=10), clock=clock)

    good = loop.run_once()
    assert not good.stale and good.source_up and good.results is not None
    assert loop.health().healthy
    assert lines(loop, "gpu_advisor_source_up") == ['gpu_advisor_source_up{source="snap"} 1.0']

    clock.now += 10
    bad = loop.run_once()
    assert bad.stale and not bad.source_up
    assert bad.results is good.results  # the last good results are still served
    assert bad.source_error == "http://x:9835/metrics: connection refused"
    assert bad.errors["ingest"] == 1 and bad.runs == 2
    assert bad.last_success_ts == good.last_success_ts
    health = loop.health()
    assert not health.healthy and "connection refused" in health.reason
    # the page still shows the last picture, with the source down and the error counted
    assert lines(loop, "gpu_advisor_source_up") == ['gpu_advisor_source_up{source="snap"} 0.0']
    assert lines(loop, "gpu_advisor_fragmentation_ratio")
    assert 'gpu_advisor_run_errors_total{stage="ingest"} 1.0' in lines(
        loop, "gpu_advisor_run_errors_total"
    )
    (last_success,) = lines(loop, "gpu_advisor_last_success_timestamp_seconds")
    assert float(last_success.split()[1]) == good.last_success_ts == 1_000_000.0

    clock.now += 10
    back = loop.run_once()
    assert not back.stale and back.source_up and back.source_error == ""
    assert back.results is not good.results
    assert back.errors["ingest"] == 1  # a counter: the old failure stays counted
    assert loop.health().healthy


def test_failing_source_before_any_good_run_serves_only_self_metrics(scripted):
    loop = AdvisorLoop("snap", scripted("snapshot x.json: no such file"), Config())
    state = loop.run_once()
    assert state.results is None and state.stale
    page = loop.current_page().body.decode()
    assert "gpu_advisor_fragmentation_ratio" not in page
    assert "gpu_advisor_run_errors_total" in page
    health = loop.health()
    assert not health.healthy and "no such file" in health.reason


def test_health_turns_unready_when_the_last_good_run_is_too_old(islands, scripted):
    clock = Clock()
    loop = AdvisorLoop("snap", scripted(islands), Config(interval_s=10), clock=clock)
    loop.run_once()
    clock.now += 29
    assert loop.health().healthy
    clock.now += 2
    health = loop.health()
    assert not health.healthy and "31s ago" in health.reason


def test_a_failing_stage_keeps_the_previous_section_marked_stale(islands, scripted, monkeypatch):
    loop = AdvisorLoop("snap", scripted(islands), Config())
    first = loop.run_once()
    assert first.results.recommendations["stale"] is False
    actions = first.results.recommendations["actions"]
    assert actions  # the islands example has a plan for an 8-GPU job

    def broken(*args, **kwargs):
        raise RuntimeError("solver exploded")

    monkeypatch.setattr(stages, "recommend_with_notes", broken)
    second = loop.run_once()
    assert not second.stale  # fragmentation is fresh; only the plan section is old
    recs = second.results.recommendations
    assert recs["stale"] is True and recs["error"] == "solver exploded"
    assert recs["actions"] == actions
    assert second.errors["plan"] == 1 and second.errors["ingest"] == 0
    assert set(second.stage_seconds) == {"ingest", "analyze", "forecast", "plan"}


def test_history_feeds_the_forecast_and_usage_window():
    clock = Clock(0.0)
    source = LiveSim("sim:a100-16x8?nodes=4", clock=clock)
    loop = AdvisorLoop("sim", source, Config(settings=Settings(horizons_h=(1, 6))))
    loop.seed_history(source.backfill(48 * 3600.0))
    assert len(loop.history) == 48
    state = loop.run_once()
    # the sim model itself has no usage samples: the idle window is judged on the history's
    assert len(state.results.model.usage.times) >= 1
    assert state.results.analysis["cluster"]["usage_samples"] >= 1
    forecast = state.results.forecast
    assert forecast["history_hours"] == 47  # the hour still running is left out
    (pool,) = forecast["pools"]
    by_horizon = {h["horizon"]: h for h in pool["horizons"]}
    assert by_horizon["1h"]["available"] and by_horizon["6h"]["available"]
    wape = by_horizon["1h"]["backtest"]["wape_ratio"]
    assert "seasonal_naive_24" in wape and by_horizon["1h"]["model"] in wape
    q = by_horizon["6h"]["quantiles"]
    assert q["0.1"] <= q["0.5"] <= q["0.9"] <= pool["capacity_gpus"]


def test_live_sim_advances_by_the_wall_time_between_reads():
    clock = Clock(100.0)
    source = LiveSim("sim:a100-16x8?nodes=2&t=1h", clock=clock)
    first = source()
    clock.now += 90
    second = source()
    assert second.timestamp - first.timestamp == pytest.approx(90.0)
    assert first.timestamp == pytest.approx(source.fleet.unix_time - 90.0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sim:a100-16x8?history=1h", "does not apply to the advisor service"),
        ("sim:nope", "unknown preset 'nope'"),
        ("sim:a100-16x8?seed=x", "seed='x' is not a whole number"),
    ],
)
def test_live_sim_rejects_bad_specs_in_one_line(spec, message):
    with pytest.raises(SourceError, match=message) as info:
        LiveSim(spec)
    assert "\n" not in str(info.value)


def test_an_unexpected_ingest_exception_is_counted_not_raised(islands):
    def explode():
        raise KeyError("surprise")

    loop = AdvisorLoop("weird", explode, Config())
    state = loop.run_once()
    assert state.errors["ingest"] == 1 and not state.source_up
    assert "surprise" in state.source_error


def test_an_unexpected_ingest_failure_logs_no_password_traceback_included(caplog):
    """The traceback of an unexpected failure is logged, and the messages in it (a library's,
    which may name the URL it read) show the source as `redact` does, causes included."""
    import logging

    source = "prometheus+http://admin:secret@host:9090"

    def explode():
        try:
            raise LookupError("no route to http://admin:secret@host:9090/api/v1/query")
        except LookupError as cause:
            raise RuntimeError(f"read of {source} failed") from cause

    loop = AdvisorLoop(source, explode, Config())
    with caplog.at_level("DEBUG", logger="advisor.service"):
        state = loop.run_once()
    assert state.errors["ingest"] == 1 and "admin:***@host" in state.source_error
    (failed,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert (
        failed.getMessage()
        == "ingest from prometheus+http://admin:***@host:9090 failed unexpectedly"
    )
    shown = [caplog.text, *(logging.Formatter().format(r) for r in caplog.records)]
    assert "Traceback" in caplog.text and "LookupError: no route to" in caplog.text
    assert "RuntimeError: read of prometheus+http://admin:***@host:9090 failed" in caplog.text
    for text in shown:
        assert "secret" not in text, text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope:x", "'nope:x' is not a source"),
        ("promethues+http://127.0.0.1:9090", "is not a source: use sim:PRESET"),
        ("prometheus+http://127.0.0.1:9090?foo=1", "unknown option 'foo'"),
        ("/nonexistent/snapshot", "is not a source"),
    ],
)
def test_a_source_no_run_could_read_is_refused_at_start(spec, message):
    with pytest.raises(SourceError, match=message) as info:
        make_ingest(spec, timeout_s=1)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "spec",
    [
        "prometheus+http://127.0.0.1:1",
        "http://127.0.0.1:1/metrics",
        "/not/yet/written.json",
        "openb:/not/yet/nodes.csv",
    ],
)
def test_a_well_formed_source_that_is_down_still_starts(spec):
    ingest = make_ingest(spec, timeout_s=1)
    assert callable(ingest)  # reading it fails each run until it comes up; nothing read yet


def test_a_failing_source_warns_of_no_results_before_any_good_run(islands, scripted, caplog):
    loop = AdvisorLoop("snap", scripted("down", islands, "down again"), Config())
    with caplog.at_level("WARNING", logger="advisor.service"):
        loop.run_once()
        loop.run_once()
        loop.run_once()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "source snap failed: down; no results yet",
        "source snap failed: down again; serving the last good results",
    ]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("prometheus+http://admin:s3cret@host:9090", "prometheus+http://admin:***@host:9090"),
        ("https://admin:p@ss@host/metrics?x=1", "https://admin:***@host/metrics?x=1"),
        ("http://token@host:9835/metrics", "http://***@host:9835/metrics"),
        (
            "http://a:1@n1/metrics,http://n2:9835/metrics,http://b:2@n3",
            "http://a:***@n1/metrics,http://n2:9835/metrics,http://b:***@n3",
        ),
        (
            "Prometheus at http://admin:s3cret@h:9090 unreachable",
            "Prometheus at http://admin:***@h:9090 unreachable",
        ),
        ("http://host:9090", "http://host:9090"),
        ("sim:a100-16x8?seed=1", "sim:a100-16x8?seed=1"),
        ("/data/user@example/cluster.json", "/data/user@example/cluster.json"),
    ],
)
def test_redact_masks_the_password_of_every_url(text, shown):
    from advisor.logs import redact

    assert redact(text) == shown


def test_a_password_in_the_source_is_never_shown(islands, caplog):
    """The label, every meta and source field, the errors and the log lines show the source
    without its password; the reader still gets the real URL."""
    import dataclasses
    import json

    from advisor.documents import as_json, build_fragmentation, build_snapshot, describe
    from tests.ports import free_port

    secret = f"prometheus+http://admin:s3cret@127.0.0.1:{free_port()}"
    down = make_ingest(secret, 1.0)  # nothing listens there: the real reader's error
    model = dataclasses.replace(islands, source=secret)
    calls = iter([model, None])

    def ingest():
        step = next(calls)
        return step if step is not None else down()

    loop = AdvisorLoop(secret, ingest, Config())
    good = loop.run_once()
    shown = [
        json.dumps(as_json(build_fragmentation(good))["source"]),
        json.dumps(as_json(build_snapshot(good))["snapshot"]["source"]),
    ]
    with caplog.at_level("INFO", logger="advisor.service"):
        bad = loop.run_once()
    assert "127.0.0.1" in bad.source_error  # the reader named the real host
    shown += [loop.current_page().body.decode(), json.dumps(as_json(describe(bad))), caplog.text]
    for text in shown:
        assert "s3cret" not in text, text
    assert describe(bad).source == secret.replace("s3cret", "***")
    assert "admin:***@" in shown[0] and "admin:***@" in caplog.text


def test_gpu_exporters_the_source_left_out_are_counted_and_named(islands, scripted):
    """A read that lacks GPU exporters (a `prometheus+` target down) serves their count on
    /metrics and their names in every API answer's meta; a whole fleet serves 0 and []."""
    from dataclasses import replace

    from advisor.documents import describe

    partial = replace(islands, left_out=("node-9:9835 (job gpu-exporter: not scraped)",))
    loop = AdvisorLoop("snap", scripted(partial, islands), Config(interval_s=10), clock=Clock())
    state = loop.run_once()
    assert lines(loop, "gpu_advisor_source_left_out_targets") == [
        'gpu_advisor_source_left_out_targets{source="snap"} 1.0'
    ]
    assert describe(state).source_left_out == ["node-9:9835 (job gpu-exporter: not scraped)"]
    state = loop.run_once()
    assert lines(loop, "gpu_advisor_source_left_out_targets") == [
        'gpu_advisor_source_left_out_targets{source="snap"} 0.0'
    ]
    assert describe(state).source_left_out == []


def test_a_shape_whose_model_no_gpu_matches_is_said_once(islands, scripted, caplog) -> None:
    """`--shapes 8@B200` on a fleet without B200: one warning naming the fleet's models, not
    one a run (and the shape still counts 0, as the contract serves it)."""
    import logging

    from advisor.fragmentation import measures

    shapes = (measures.parse_shape("8@B200"), measures.parse_shape("8"))
    config = Config(interval_s=10, settings=Settings(measures=measures.Settings(shapes=shapes)))
    loop = AdvisorLoop("snap", scripted(islands), config, clock=Clock())
    with caplog.at_level(logging.WARNING, logger=loop_module.__name__):
        loop.run_once()
        loop.run_once()
    said = [r.getMessage() for r in caplog.records if "B200" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        "--shapes: 8 GPU [B200]: no GPU model here matches 'B200' (models: "
    )
