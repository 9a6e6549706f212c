"""The prometheus+http INPUT form goes through the shared client's range query and masks gaps."""

import numpy as np
import pytest

from advisor.forecast.promsource import read_prometheus


class FakeClient:
    def __init__(self):
        self.calls = []

    def range(self, query, start, end, step):
        self.calls.append((query, start, end, step))
        t = np.array([0.0, 3600.0, 10800.0])  # 7200 missing: a gap
        if query.startswith("cap"):
            return [("", {"pool": "a"}, t, np.array([8.0, 8.0, 8.0]))]
        return [("", {"pool": "a"}, t, np.array([1.0, 2.0, 3.0]))]


def test_prometheus_input_builds_a_panel_with_capacity_and_gaps():
    client = FakeClient()
    p = read_prometheus(
        "prometheus+http://prom:9090/?query=used&capacity=cap&days=1&step=3600&by=pool",
        client=client,
        now=86400.0,
    )
    assert client.calls[0] == ("used", 0.0, 86400.0, 3600.0)
    assert p.series == ["a"]
    assert len(p.index) == 4 and np.isnan(p.values["a"].iloc[2])
    assert p.capacity["a"].iloc[0] == 8.0


def test_a_query_without_series_is_one_line_not_a_pandas_error():
    class Empty(FakeClient):
        def range(self, query, start, end, step):
            return []

    with pytest.raises(ValueError, match=r"^the query returned no series over the last 2 days$"):
        read_prometheus("prometheus+http://prom:9090/?query=nothing&days=2", client=Empty())
