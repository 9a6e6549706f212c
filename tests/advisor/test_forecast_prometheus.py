"""The prometheus+http INPUT form goes through the shared client's range query and masks gaps."""

import re

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


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ("query=used&day=3", "unknown prometheus input option 'day'; known: query, capacity, "),
        ("query=used&step=abc", "option step='abc': needs seconds > 0 or a duration, e.g. step="),
        ("query=used&step=0", "option step='0': needs seconds > 0"),
        ("query=used&days=-1", "option days='-1': needs a number of days > 0, e.g. days=30"),
        ("query=used&days=nan", "option days='nan': needs a number of days > 0"),
        ("query=", "needs ?query=<PromQL>"),
    ],
)
def test_a_bad_option_is_named_with_its_accepted_form(options, words):
    """Unknown options were ignored; a bad step or days was "could not convert string to float"."""
    client = FakeClient()
    with pytest.raises(ValueError, match=re.escape(words)) as error:
        read_prometheus(f"prometheus+http://prom:9090/?{options}", client=client, now=86400.0)
    assert "\n" not in str(error.value)
    assert client.calls == []  # refused before any query


def test_a_step_may_be_a_duration():
    client = FakeClient()
    read_prometheus(
        "prometheus+http://p:9090/?query=used&step=1h&days=1", client=client, now=86400.0
    )
    assert client.calls[0] == ("used", 0.0, 86400.0, 3600.0)


def test_two_result_series_of_one_name_are_refused_not_averaged():
    class Twins(FakeClient):
        def range(self, query, start, end, step):
            t = np.array([0.0, 3600.0])
            return [("", {"pool": "a", "gpu": str(i)}, t, np.array([1.0, 2.0])) for i in (0, 1)]

    with pytest.raises(
        ValueError, match=r"two result series are both named 'a' .* sum by \(pool\)"
    ):
        read_prometheus("prometheus+http://p:9090/?query=used&by=pool", client=Twins(), now=7200.0)


def test_a_reply_that_is_not_the_api_shape_is_one_input_line(monkeypatch):
    """A JSON list body (a proxy, another service on the port) raised AttributeError."""
    import advisor.ingest.prometheus as prometheus
    from advisor.forecast.io import InputError, load

    class Reply:
        status_code = 200

        def json(self):
            return ["not", "an", "API", "reply"]

    class Session:
        def get(self, *_args, **_kw):
            return Reply()

    monkeypatch.setattr(prometheus.requests, "Session", Session)
    source = "prometheus+http://prom:9090/?query=used"
    with pytest.raises(InputError) as error:
        load(source)
    assert str(error.value).startswith(f"{source}: Prometheus at http://prom:9090")
    assert "\n" not in str(error.value)
