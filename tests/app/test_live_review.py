"""The app live, for a review: the Forecast page is drawn again when the forecast changes (once an
hour), not at every reading; a frozen review keeps its run while the advisor goes on."""

from __future__ import annotations

import pytest

from advisor.app import data
from advisor.ingest.live import LiveSim
from tests.app.conftest import metrics, open_app

SPEC = "http://fleet.invalid/metrics"  # a live source; its reads come from the sim below


@pytest.fixture
def stepped(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """A live source whose reads are a simulated fleet at the time the test sets (seconds)."""
    clock = {"t": 3 * 86400.0 + 600.0}

    def read(spec: str):
        sim = LiveSim(f"sim:a100-16x8?t={clock['t']:.0f}s", clock=lambda: 0.0)
        return sim()

    monkeypatch.setattr(data, "load_model", read)
    return clock


def test_the_forecast_page_waits_for_the_forecast_the_others_follow_each_reading(
    stepped: dict[str, float],
) -> None:
    advisor = data.LocalAdvisor(SPEC, refresh_s=3600)
    try:
        assert advisor.wait_settled(120)
        first, _ = advisor.latest()
        stepped["t"] += 900.0  # a reading 15 minutes later, the same hour
        advisor.run_once()
        second, _ = advisor.latest()
        assert second is not first
        assert data.page_version("Fleet", second) != data.page_version("Fleet", first)
        assert data.page_version("Forecast", second) == data.page_version("Forecast", first)
        stepped["t"] += 3600.0  # another hour has completed: a new forecast
        advisor.run_once()
        third, _ = advisor.latest()
        assert data.page_version("Forecast", third) != data.page_version("Forecast", second)
    finally:
        advisor.stop()


def test_a_frozen_review_keeps_its_run_while_the_advisor_goes_on(
    stepped: dict[str, float],
) -> None:
    at = open_app(SPEC)
    advisor, _ = data.get_advisor(SPEC)
    before, _ = advisor.latest()
    at.sidebar.toggle(key="freeze").set_value(True).run()
    assert any(c.value.startswith("Frozen at ") for c in at.sidebar.caption)
    shown = metrics(at)
    stepped["t"] += 6 * 3600.0  # six hours on: another fleet
    advisor.run_once()
    after, _ = advisor.latest()
    assert after.view.version != before.view.version
    at.run()
    assert metrics(at) == shown  # still the frozen run
    assert at.session_state[data.FROZEN].view is before.view
    at.sidebar.toggle(key="freeze").set_value(False).run()
    free = after.result["spatial"]["free_gpus"]
    assert metrics(at)["Free"] == f"{free:,}"  # the latest run again
    assert not any(c.value.startswith("Frozen at ") for c in at.sidebar.caption)
