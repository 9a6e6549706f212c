"""Start-up backfill: the past read from Prometheus (one instant an hour) or stepped in a sim."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from advisor.history import History
from advisor.ingest import backfill as B
from advisor.ingest import prometheus
from advisor.ingest.exporter_scrape import SourceUnavailable
from advisor.ingest.live import LiveSim
from advisor.ingest.readings import from_readings
from advisor.ingest.sources import load_source
from advisor.model import ModelError
from exporter.readings import Collection
from exporter.render import SelfState, render_page
from gpu_defrag_sim.fleet import SimFleet

SPEC = "prometheus+http://prometheus.test:9090"
T0 = 1_700_000_000.0  # Unix time of the simulated fleet's t = 0
STATE = SelfState("0.1.0", "test", True, 0.01, T0, 1, {})


class SimPrometheus:
    """Answers the state query at time `at` with the exporter page a sim fleet shows then, as
    Prometheus returns it (job and instance added); nothing before `retention_from`."""

    def __init__(self, retention_from: float = -np.inf, fail_after: int | None = None) -> None:
        self.fleet = SimFleet("a100-16x8", 7, 4)
        self.retention_from = retention_from
        self.fail_after = fail_after
        self.calls: list[float] = []
        self.allocated: dict[float, float] = {}  # milli-GPUs allocated at each answer

    def start_time(self) -> float:
        return T0 - 86400.0  # running since before the fleet: no restart's leftovers to ask for

    def instant(self, query: str, at: float | None = None) -> list:
        assert query == prometheus.STATE_QUERY and at is not None
        self.calls.append(at)
        if self.fail_after is not None and len(self.calls) > self.fail_after:
            raise SourceUnavailable("Prometheus at http://prometheus.test:9090 unreachable: boom")
        if at < self.retention_from:
            return []
        assert at - T0 >= self.fleet.now, "instants are read oldest first"
        self.fleet.advance(at - T0 - self.fleet.now)
        readings = self.fleet.readings(lambda s: T0 + s)
        self.allocated[at] = float(from_readings(readings).gpu_milli_allocated.sum())
        text = render_page(Collection(readings, at), [], STATE).body.decode()
        labels = {"job": "gpu-exporter", "instance": "exporter:9835"}
        return [
            (s.name, {**s.labels, **labels}, s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]


NOW = T0 + 3 * 86400.0 + 1234.0  # a restart at an odd minute, 3 days into the fleet's life


def test_one_instant_an_hour_oldest_first_each_the_state_prometheus_held_then():
    client = SimPrometheus()
    past = B.from_prometheus(SPEC, 48 * 3600.0, now=NOW, client=client)
    times = [m.timestamp for m in past.models]
    assert times == [NOW - 3600.0 * k for k in range(48, 0, -1)]
    assert client.calls == times
    assert [float(m.gpu_milli_allocated.sum()) for m in past.models] == [
        client.allocated[t] for t in times
    ]
    assert len(set(client.allocated.values())) > 1  # the fleet moved: the hours differ
    assert (past.empty, past.failed, past.reason) == (0, 0, "")
    assert past.summary().startswith(f"backfilled 48 past hour(s) of 48 h from {SPEC} in ")


def test_a_source_pinned_at_an_instant_backfills_the_hours_before_it():
    client = SimPrometheus()
    past = B.from_prometheus(f"{SPEC}?at={NOW:.0f}&history=5m", 3 * 3600.0, client=client)
    assert [m.timestamp for m in past.models] == [round(NOW) - 3600.0 * k for k in (3, 2, 1)]


def test_hours_before_retention_are_skipped_and_counted():
    client = SimPrometheus(retention_from=NOW - 30 * 3600.0)
    past = B.from_prometheus(SPEC, 7 * 86400.0, now=NOW, client=client)
    assert len(client.calls) == 168
    assert len(past.models) == 30 and past.empty == 138
    assert past.models[0].timestamp == NOW - 30 * 3600.0
    assert "138 hour(s) without GPU series" in past.summary()


def test_an_unreachable_prometheus_stops_with_what_was_read():
    past = B.from_prometheus(SPEC, 24 * 3600.0, now=NOW, client=SimPrometheus(fail_after=5))
    assert len(past.models) == 5
    assert past.reason == "stopped: Prometheus at http://prometheus.test:9090 unreachable: boom"
    assert past.summary().endswith(past.reason)


def test_an_instant_that_makes_no_model_is_skipped(monkeypatch):
    real = prometheus.load
    bad = NOW - 3 * 3600.0

    def load(base, **kw):
        if kw["at"] == bad:
            raise ModelError("gpus", "gpu 3 of node a100-node-01 reported twice")
        return real(base, **kw)

    monkeypatch.setattr(prometheus, "load", load)
    past = B.from_prometheus(SPEC, 6 * 3600.0, now=NOW, client=SimPrometheus())
    assert len(past.models) == 5 and bad not in [m.timestamp for m in past.models]
    assert past.failed == 1
    assert past.reason == "2023-11-17T19:33:54Z: gpus: gpu 3 of node a100-node-01 reported twice"


def test_a_stop_signal_ends_the_backfill():
    client = SimPrometheus()
    calls = iter(range(100))
    past = B.from_prometheus(
        SPEC, 24 * 3600.0, now=NOW, client=client, cancelled=lambda: next(calls) >= 3
    )
    assert len(past.models) == 3 and past.reason == "stopped"


def test_backfilled_hours_give_the_forecast_its_history():
    """A restart with a Prometheus backfill forecasts at once: the hours become pool demand."""
    past = B.from_prometheus(SPEC, 40 * 3600.0, now=NOW, client=SimPrometheus())
    history = History()
    for model in past.models:
        history.append(model)
    demand = history.pool_demand()
    assert demand["time"].nunique() == 40
    assert (demand["allocated_gpus"] > 0).all()


def test_which_sources_have_a_past_and_their_default_spans():
    assert B.default_span_s("sim:a100-16x8") == 7 * 86400.0  # as the app reads the same spec
    assert B.default_span_s("sim:a100-16x8?nodes=1000") == 72 * 3600.0  # a week: over a minute
    assert B.default_span_s(SPEC) == 7 * 86400.0
    assert B.default_span_s("http://node1:9835/metrics") == 7 * 86400.0  # if a sim's
    assert B.default_span_s("snapshot.json") == 0.0
    assert B.backfill("http://127.0.0.1:1/metrics", lambda: None, 3600.0) is None  # unreachable
    assert B.backfill(SPEC, lambda: None, 0.0) is None
    sim = LiveSim("sim:a100-16x8?nodes=2&t=5h", clock=lambda: 0.0)
    past = B.backfill("sim:a100-16x8?nodes=2&t=5h", sim, 3 * 3600.0)
    assert [m.timestamp - past.models[0].timestamp for m in past.models] == [0.0, 3600.0, 7200.0]


def test_a_malformed_spec_is_a_source_error():
    from advisor.ingest.sources import SourceError

    with pytest.raises(SourceError, match="unknown option 'foo'"):
        B.from_prometheus(SPEC + "?foo=1", 3600.0, now=NOW, client=SimPrometheus())


def test_the_flag_its_earlier_name_and_the_per_source_default(capsys):
    from advisor.cli import build_parser

    def parsed(*extra: str):
        return build_parser().parse_args(["advise", "--source", "sim:a100-16x8", *extra])

    assert parsed().history_backfill is None  # the source's default (`default_span_s`)
    assert parsed("--history.backfill", "10d").history_backfill == 10 * 86400.0
    assert parsed("--sim.backfill", "48h").history_backfill == 48 * 3600.0
    assert parsed("--history.backfill", "0").history_backfill == 0.0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["advise", "--help"])
    shown = capsys.readouterr().out
    assert "--history.backfill" in shown and "--sim.backfill" not in shown


def _served(collection) -> str:
    return render_page(collection, [], STATE).body.decode()


def test_a_sim_exporter_url_has_its_fleet_re_simulated_on_its_clock():
    """The exporter's page names its fleet and clock; the same fleet re-simulated hour by hour
    is the model a live read of the exporter would have given then, stamped on its clock."""
    from exporter.backends.sim import SimBackend
    from tests.advisor.test_ingest import same_state
    from tests.fakes.page_server import Routes, serve

    backend = SimBackend(nodes=2, speed=60.0, start_s=86400.0, clock=lambda: T0)
    backend.start()
    routes = Routes()
    routes.text("/metrics", _served(backend.collect()))
    then = SimFleet("a100-16x8", 42, 2)
    then.advance(86400.0 - 3600.0)
    routes.text("/then", _served(Collection(then.readings(), 0.0)))
    routes.text("/real", _served(Collection(SimFleet("a100-16x8", 42, 1).readings(), 0.0)))
    with serve(routes) as base:
        live = load_source(f"{base}/metrics")
        past = B.from_sim_exporter(f"{base}/metrics", 30 * 3600.0)
        shown_then = load_source(f"{base}/then")
        assert B.from_sim_exporter(f"{base}/real", 3600.0) is None  # no sim clock on the page
        assert B.past(f"{base}/metrics,{base}/then", 3600.0) is None  # several pages: no
    assert live.timestamp == T0  # the simulated clock at --sim.start, stamped at the start
    assert [m.timestamp for m in past.models] == [T0 - 3600.0 * k for k in range(24, 0, -1)]
    assert past.empty == 6  # the 6 hours before the fleet's t = 0
    assert "6 hour(s) without GPU series (before the simulated fleet's start)" in past.summary()
    assert same_state(past.models[-1], shown_then)
    assert not same_state(past.models[0], shown_then)  # the hours differ
