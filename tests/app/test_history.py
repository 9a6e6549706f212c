"""advisor.history: bounded, monotonic, and the usage window really decides "idle"."""

from __future__ import annotations

import math

import numpy as np
import pytest

from advisor.fragmentation import measures
from advisor.history import History, pool_rows
from advisor.model import ModelBuilder
from tests.conftest import add_nodes


def gpu_uuid(node: str, index: int) -> str:
    return f"{node}-{index}"


def _model(t: float, util: float, *, pending: bool = False):
    builder = ModelBuilder()
    for node, pool in (("n1", "a100"), ("n2", "v100")):
        add_nodes(
            [node],
            2,
            builder=builder,
            pool=pool,
            gpu_model=pool.upper(),
            uuid=gpu_uuid,
            utilization_ratio=util,
        )
    builder.add_allocation("job", num_gpu=2, node="n1", gpus=[0, 1], tenant="t")
    if pending:
        builder.add_allocation("wait", num_gpu=2, gpu_spec="V100")
    return builder.build(timestamp=t)


def test_bounded_and_monotonic() -> None:
    history = History(max_points=3)
    for t in (10.0, 20.0, 30.0, 40.0):
        history.append(_model(t, 0.5))
    history.append(_model(25.0, 0.5))  # older than the last: ignored
    assert history.latest_timestamp() == 40.0 and History().latest_timestamp() is None
    trend = history.trend()
    assert len(trend) == 3
    assert [ts.timestamp() for ts in trend["time"]] == [20.0, 30.0, 40.0]
    with pytest.raises(ValueError):
        history.append(_model(math.nan, 0.5))


def test_older_observations_thin_to_the_last_of_each_hour() -> None:
    """At a 15-minute refresh, 2 h at full resolution and hourly before that: 50 points span
    the 40 hours a 24-h forecast needs, and each older hour keeps its last observation."""
    history = History(max_points=50, hourly_after_s=2 * 3600.0)
    times = [900.0 * k for k in range(4 * 48)]  # 48 h at 15 min
    for t in times:
        history.append(_model(t, 0.5))
    kept = [p.timestamp for p in history.points()]
    latest = times[-1]
    recent = [t for t in times if t >= latest - 2 * 3600.0]
    thinned = [t for t in times if t < latest - 2 * 3600.0]
    older = [t for t in thinned if t == max(u for u in thinned if u // 3600 == t // 3600)]
    assert kept == (older + recent)[-50:]
    assert len(kept) == 50 and kept[0] < latest - 40 * 3600.0
    demand = history.pool_demand()
    assert demand["time"].is_monotonic_increasing
    history.append(_model(kept[-1] - 1.0, 0.5))  # older than the last: still ignored
    assert [p.timestamp for p in history.points()] == kept
    plain = History(max_points=50)
    for t in times[:50]:
        plain.append(_model(t, 0.5))
    assert [p.timestamp for p in plain.points()] == times[:50]  # under the bound: every one
    for t in times[50:]:
        plain.append(_model(t, 0.5))
    kept = [p.timestamp for p in plain.points()]
    assert len(kept) == 50 and kept[-1] == latest
    # at the bound the oldest hours were thinned before any was dropped: 47 of the 48 hours
    # are still there (a plain bound would keep the last 12.5), each older one once
    hours = [t // 3600 for t in kept]
    assert sorted(set(hours)) == list(range(1, 48))
    hourly = [t for t in kept if t // 3600 < kept[-1] // 3600 - 1]
    assert all(t % 3600 == 2700.0 for t in hourly)  # each thinned hour kept its last reading


def test_idle_needs_the_whole_window() -> None:
    history = History(usage_window_s=3600)
    history.append(_model(0.0, 0.9))  # busy an hour ago...
    history.append(_model(1800.0, 0.0))
    now = history.with_usage(_model(3600.0, 0.0))  # ...idle since: not idle for the window
    assert len(now.usage.times) == 3
    idle_window = measures.IdlePolicy(threshold=0.05, window_s=3600)
    assert not measures.allocated_idle(now, idle_window).any()
    later = History(usage_window_s=3600)
    later.append(_model(1800.0, 0.0))
    quiet = later.with_usage(_model(3600.0, 0.0))
    assert measures.allocated_idle(quiet, idle_window).sum() == 2


def test_usage_is_matched_by_gpu_key_and_missing_stays_nan() -> None:
    history = History()
    history.append(_model(0.0, 0.3))
    builder = add_nodes(  # n2 gone, a new n3
        ["n1", "n3"], 2, pool="a100", gpu_model="A100", uuid=gpu_uuid, utilization_ratio=0.7
    )
    model = history.with_usage(builder.build(timestamp=60.0))
    first = model.usage.utilization_ratio[0]
    assert np.allclose(first[:2], 0.3)  # n1 seen before
    assert np.isnan(first[2:]).all()  # n3 is new: no made-up past
    assert np.allclose(model.usage.utilization_ratio[1], 0.7)


def test_pool_demand_counts_allocated_capacity_and_queue() -> None:
    rows = {row["pool"]: row for row in pool_rows(_model(0.0, 0.5, pending=True))}
    assert rows["a100"] == {
        "pool": "a100",
        "allocated_gpus": 2.0,
        "held_gpus": 2.0,
        "capacity_gpus": 2.0,
        "pending_gpus": 0.0,
    }
    assert rows["v100"]["pending_gpus"] == 2.0 and rows["v100"]["allocated_gpus"] == 0.0
    history = History()
    history.append(_model(0.0, 0.5, pending=True))
    history.append(_model(60.0, 0.5))
    demand = history.pool_demand()
    assert len(demand) == 4 and set(demand["pool"]) == {"a100", "v100"}
