"""A source whose clock goes back: a sim exporter restarted at speed 3600 is hours behind its
last reading. The advisor skipped every such reading without a word, so its history stood still
until the new clock caught up (days, for a demo left running). Now a short step back is said
once; a long one starts the history anew from the source's past, with one warning."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import requests

from advisor.history import History
from advisor.ingest.backfill import backfill
from advisor.ingest.live import make_ingest
from advisor.model import ModelBuilder
from advisor.service.loop import AdvisorLoop, Config
from tests.ports import free_port


@contextlib.contextmanager
def sim_exporter(port: int) -> Iterator[subprocess.Popen]:
    """A sim exporter at an hour a second on `port`, until the block ends."""
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "advisor.cli", "exporter", "--backend", "sim"),
            *("--sim.preset", "a100-16x8", "--sim.speed", "3600", "--collect.interval", "1s"),
            *("--web.listen-address", f"127.0.0.1:{port}"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(requests.ConnectionError):
                if (
                    b"gpu_sim_time_seconds"
                    in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).content
                ):
                    break
            assert time.monotonic() < deadline, "the sim exporter did not come up"
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_a_restarted_sim_exporter_starts_the_history_anew_from_its_past(caplog):
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    ingest = make_ingest(url, 5.0)
    pasts = []

    def past():
        read = backfill(url, ingest, 6 * 3600.0, timeout=5.0)
        pasts.append(read)
        return read.models

    loop = AdvisorLoop(url, ingest, Config(interval_s=60), History(), past=past)
    with sim_exporter(port):
        time.sleep(4)  # four simulated hours
        loop.run_once()
        time.sleep(2)
        loop.run_once()
    before = loop.history.latest_timestamp()
    assert len(loop.history) == 2
    with sim_exporter(port), caplog.at_level(logging.WARNING, logger="advisor.service"):
        loop.run_once()  # its clock now stands hours before `before`
    assert loop.history.latest_timestamp() < before - 3 * 3600
    (warning,) = [r.getMessage() for r in caplog.records if "clock went back" in r.getMessage()]
    assert f"source {url}: its clock went back: a reading at" in warning
    assert "the history starts again with" in warning
    assert len(pasts) == 1 and len(loop.history) == 1 + sum(
        m.timestamp < loop.history.latest_timestamp() for m in pasts[0].models
    )
    assert loop.state().stale is False  # served fresh: the reading itself was fine


def _model(stamp: float):
    builder = ModelBuilder()
    builder.add_node("n1")
    builder.add_gpu("n1", 0)
    return builder.build(timestamp=stamp)


@pytest.mark.parametrize(("step_back_s", "restarted"), [(30.0, False), (7200.0, True)])
def test_a_short_step_back_is_said_once_and_a_long_one_restarts_the_history(
    caplog, step_back_s, restarted
):
    stamps = iter([10_000.0, 10_060.0, 10_060.0 - step_back_s, 10_060.0 - step_back_s + 5])
    loop = AdvisorLoop(
        "test", lambda: _model(next(stamps)), Config(interval_s=10), History(), past=lambda: ()
    )
    with caplog.at_level(logging.WARNING, logger="advisor.service"):
        for _ in range(4):
            loop.run_once()
    said = [r.getMessage() for r in caplog.records]
    if restarted:
        assert len(said) == 1 and "its clock went back" in said[0]
        assert len(loop.history) == 2  # the new timeline's two readings
    else:
        assert len(said) == 1 and "older than the last one" in said[0]
        assert "records none until the source's clock passes it" in said[0]
        assert len(loop.history) == 2  # the two before the step
