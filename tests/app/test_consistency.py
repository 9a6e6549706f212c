"""One answer everywhere: every page of the app, open on a running `gpu-defrag advise`, shows the
numbers its API routes serve for the same run (the service's interval is an hour: one run).

Job-end learning is the example of the issue that asked for this test: "learned from N finished
jobs" is one N on the Forecast page, on the What-if page, in /api/recommendations and in
/api/job-ends.
"""

from __future__ import annotations

import re

import pytest
import requests

from advisor.app import data, forecasts
from tests.app.conftest import frame_with, metrics, open_app
from tests.service.conftest import advisor_process

SOURCE = "sim:a100-16x8?t=5d"  # five days: idle windows (112 h for 8 h) too


@pytest.fixture(scope="module")
def service():
    """The advisor on a simulated fleet five days in (its past read back): forecasts, idle
    windows and learned job ends from the first run; one run an hour, so one run here."""
    args = ("--source", SOURCE, "--advise.interval", "1h", "--history.backfill", "120h")
    with advisor_process(*args, ready="/health", timeout_s=300.0) as (base, _process):
        yield base


@pytest.fixture(scope="module")
def api(service) -> dict:
    """Every route's answer for the service's run."""
    routes = {
        "fragmentation": "/api/fragmentation?nodes=true",
        "forecast": "/api/forecast",
        "recommendations": "/api/recommendations",
        "job_ends": "/api/job-ends",
        "history": "/api/history?hours=384",
        "snapshot": "/api/snapshot",
    }
    docs = {name: requests.get(service + path, timeout=30).json() for name, path in routes.items()}
    assert len({doc["meta"]["runs"] for doc in docs.values()}) == 1  # one run behind them all
    return docs


def test_every_page_shows_what_the_api_serves(service, api) -> None:
    spec = data.advisor_source(service)
    frag = api["fragmentation"]

    at = open_app(spec)  # Fleet
    shown = metrics(at)
    assert shown["GPUs"] == f"{frag['cluster']['gpus']:,}"
    assert shown["Free"] == f"{frag['spatial']['free_gpus']:,}"
    assert shown["Allocated, idle"] == f"{frag['temporal']['allocated_idle_gpus']:,}"
    busy = frag["temporal"]["allocated_gpus"] - frag["temporal"]["allocated_idle_gpus"]
    assert shown["Allocated, busy"] == f"{busy:,}"

    at.switch_page("views/fragmentation.py").run()
    assert not at.exception and not at.error
    shown = metrics(at)
    assert shown["Fragmentation rate"] == f"{frag['fgd']['fragment_rate']:.1%}"
    assert shown["Fragmented GPUs"] == f"{frag['fgd']['fragment_gpus']:,.1f}"
    assert shown["Largest job on one node"] == (
        f"{frag['spatial']['largest_job']['single_node_gpus']} GPUs"
    )
    shapes = frame_with(at, "jobs that can start now")
    assert shapes["jobs that can start now"].tolist() == [
        s["jobs_that_fit"] for s in frag["spatial"]["shapes"]
    ]
    observations = len(api["history"]["trend"])
    assert any(f"{observations} observations" in c.value for c in at.caption)

    at.switch_page("views/forecast.py").run()
    assert not at.exception and not at.error
    doc = api["forecast"]
    table = frame_with(at, "backtest WAPE")
    expected = forecasts.horizons_frame(doc)
    assert table["forecast GPUs"].tolist() == expected["forecast GPUs"].tolist()
    assert table["backtest WAPE"].tolist() == expected["backtest WAPE"].tolist()
    idle = frame_with(at, "free GPUs for the whole window")
    assert idle["free GPUs for the whole window"].tolist() == (
        forecasts.idle_frame(doc)["free GPUs for the whole window"].tolist()
    )
    learned = _learned_from(" ".join(c.value for c in at.caption))

    at.switch_page("views/actions.py").run()
    at.text_input(key="actions_goal").set_value("").run()  # the advisor's own plans alone
    assert not at.exception and not at.error
    served = api["recommendations"]["plans"]
    if served:
        overview = frame_with(at, "GPU-hours held idle")
        assert overview["goal"].tolist() == [p["goal"] for p in served]
        assert overview["steps"].tolist() == [len(p["actions"]) for p in served]
        assert overview["restarts"].tolist() == [p["cost"]["restarts"] for p in served]

    at.switch_page("views/whatif.py").run()
    fits = {s["shape"]: s["jobs_that_fit"] for s in frag["spatial"]["shapes"]}
    blocked = [k for k in (2, 4) if fits[f"{k}x8 GPU"] == 0]
    assert blocked, fits  # three days in, a multi-node job waits (the service plans for it)
    at.number_input(key="wi_nodes").set_value(blocked[0]).run()
    assert not at.exception
    waited = _learned_from(" ".join(m.value for m in at.markdown))

    # one N: both pages, the plans' job ends and the per-job list
    ends = api["recommendations"]["job_ends"]
    assert ends["finished_jobs"] == api["job_ends"]["finished_jobs"]
    assert learned == waited == ends["finished_jobs"] > 0


def _learned_from(text: str) -> int:
    (n,) = re.findall(r"learned from (\d+) finished jobs", text)
    return int(n)
