"""Which work a plan may move: annotation, priority threshold, controller."""

from __future__ import annotations

import math

import pytest

from advisor.ingest.movability import DEFAULT_PRIORITY_THRESHOLD, migratable, restart_cost_s


@pytest.mark.parametrize(
    ("annotation", "priority", "controller", "expected"),
    [
        (None, 0, "Job", True),
        (None, 0, "PyTorchJob", True),
        (None, 0, "StatefulSet", False),
        (None, 0, "Deployment", False),
        (None, 0, "", False),  # a bare pod: nothing recreates it
        (None, 0, "SomeCustomKind", False),
        (None, DEFAULT_PRIORITY_THRESHOLD, "Job", False),
        (None, DEFAULT_PRIORITY_THRESHOLD - 1, "Job", True),
        ("true", 2_000_000_000, "StatefulSet", True),  # the owner's word wins
        ("false", 0, "Job", False),
        ("yes", 0, "Job", True),  # a typo counts as absent
        ("yes", 0, "StatefulSet", False),
    ],
)
def test_migratable(annotation, priority, controller, expected):
    allowed, why = migratable(annotation, priority, controller)
    assert allowed is expected
    assert bool(why) is (not expected or annotation == "yes")


def test_restart_cost():
    assert restart_cost_s("15m") == (900.0, "")
    assert math.isnan(restart_cost_s(None)[0])
    value, problem = restart_cost_s("soon")
    assert math.isnan(value) and "not a duration" in problem
