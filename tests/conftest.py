"""What every test module shares: the `slow` rule.

`slow` marks the tests that start real servers (ours, Prometheus, Alertmanager, slurmctld) or a
browser, and the benchmark smoke runs: `pytest -m "not slow"` is the fast loop while changing
code, `pytest` (what `make test` runs) runs everything. Every test under tests/integration/ and
every `integration` test is slow without saying so again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("integration") or INTEGRATION in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)
