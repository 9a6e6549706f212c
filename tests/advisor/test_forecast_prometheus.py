"""The prometheus+http INPUT form goes through the shared client's range query and masks gaps."""

import re

import numpy as np
import pytest

from advisor.forecast.readers.prometheus import read_prometheus


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
        (
            "query=used&days=1400&step=1m",
            "days=1400 at step=1m is 2,016,001 steps per series; at most 2,000,000: use a longer",
        ),
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
    from advisor.forecast.errors import InputError
    from advisor.forecast.io import load

    class Reply:
        status_code = 200

        def json(self):
            return ["not", "an", "API", "reply"]

    def get(*_args, **_kw):  # the client's one HTTP call (gpu_defrag_common.bounded_get.get)
        return Reply()

    monkeypatch.setattr(prometheus.bounded_get, "get", get)
    source = "prometheus+http://prom:9090/?query=used"
    with pytest.raises(InputError) as error:
        load(source)
    assert str(error.value).startswith(f"{source}: Prometheus at http://prom:9090")
    assert "\n" not in str(error.value)


T0 = 1767607200  # 2026-01-05T10:00:00Z


def _serve(monkeypatch, answers: dict[str, dict[str, list[str]]]) -> None:
    """Prometheus answers each range query `answers[query]`, {pool: values as the API writes
    them ("-3", "+Inf", "NaN")}, hourly from `T0`, so the client's own parsing runs too."""
    import advisor.ingest.prometheus as prometheus

    class Reply:
        status_code = 200

        def __init__(self, body):
            self.body = body

        def json(self):
            return self.body

    def get(_url, _timeout, *, cap, session=None, params=None):  # gpu_defrag_common.bounded_get.get
        result = [
            {"metric": {"pool": pool}, "values": [[T0 + 3600 * i, v] for i, v in enumerate(vs)]}
            for pool, vs in answers[params["query"]].items()
        ]
        return Reply({"status": "success", "data": {"resultType": "matrix", "result": result}})

    monkeypatch.setattr(prometheus.bounded_get, "get", get)


OK = ["4", "5", "6", "7"]


@pytest.mark.parametrize(
    ("used", "cap", "says"),
    [
        (
            ["1", "-3", "2", "-1"],
            OK,
            "series 'h100' value -3 at 2026-01-05T11:00:00Z is negative; 2 bad values in all",
        ),
        (
            ["1", "+Inf", "NaN", "2"],
            OK,
            "series 'h100' value inf at 2026-01-05T11:00:00Z is infinite",
        ),
        (
            ["1", "2", "1e+300", "NaN"],
            OK,
            "series 'h100' value 1e+300 at 2026-01-05T12:00:00Z is above 1,000,000,000: more GPUs "
            "or nodes than any fleet holds",
        ),
        (
            OK,
            ["8", "-1", "-Inf", "8"],
            "series 'h100' capacity -1 at 2026-01-05T11:00:00Z is negative; 2 bad capacities in all",
        ),
        (
            OK,
            ["8", "8", "8", "+Inf"],
            "series 'h100' capacity inf at 2026-01-05T13:00:00Z is infinite",
        ),
        (
            OK,
            ["1e300", "8", "8", "8"],
            "series 'h100' capacity 1e+300 at 2026-01-05T10:00:00Z is above 1,000,000,000: more "
            "GPUs or nodes than any fleet holds",
        ),
    ],
    ids=["negative", "inf", "1e300", "negative-capacity", "inf-capacity", "1e300-capacity"],
)
@pytest.mark.parametrize("command", ["backtest", "forecast"])
def test_an_impossible_prometheus_reading_is_one_line_naming_series_time_and_value(
    monkeypatch, tmp_path, capsys, command, used, cap, says
):
    """They were refused by the long format's check, but as `value '-3.0' in row 6`: a row of
    the reader's own concatenation of the reply, which names neither the series nor the time."""
    _serve(monkeypatch, {"used": {"a100": OK, "h100": used}, "cap": {"a100": OK, "h100": cap}})
    from advisor.cli import main

    source = "prometheus+http://prom:9090/?query=used&capacity=cap&by=pool"
    out = tmp_path / "out"
    assert main([command, source, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"gpu-defrag {command}: error: {source}: {says}\n"
    assert captured.out == "" and not out.exists()


def test_a_prometheus_time_outside_1970_2200_is_one_line_naming_the_series():
    """A time past pandas' clock was "Out of bounds microsecond timestamp: 318857-05-20 …"."""

    class Far(FakeClient):
        def range(self, query, start, end, step):
            t = np.array([1e13, 1e13 + 3600.0])
            return [("", {"pool": "a100"}, t, np.array([1.0, 2.0]))]

    with pytest.raises(ValueError) as error:
        read_prometheus("prometheus+http://p:9090/?query=used&by=pool", client=Far(), now=7200.0)
    assert str(error.value) == (
        "series 'a100' time 10000000000000 (epoch seconds) is outside the years 1970–2200 "
        "(a mistyped year?); 2 bad times in all"
    )


def test_a_nan_from_prometheus_is_a_masked_point_not_an_error(monkeypatch):
    """Prometheus writes a stale or 0/0 sample as "NaN": a gap, masked as a file's empty value."""
    from advisor.forecast.io import load

    _serve(monkeypatch, {"used": {"a100": ["1", "NaN", "3", "4"]}, "cap": {"a100": OK}})
    panel = load("prometheus+http://prom:9090/?query=used&capacity=cap&by=pool")
    assert panel.values["a100"].tolist()[0] == 1.0
    assert np.isnan(panel.values["a100"].iloc[1])
    assert panel.values["a100"].tolist()[2:] == [3.0, 4.0]
    assert panel.capacity["a100"].tolist() == [4.0, 5.0, 6.0, 7.0]


def test_a_valid_prometheus_series_reads_exactly_as_before(monkeypatch):
    """Values above their capacity are accepted, as in the long format (forecasts are clipped)."""
    import pandas as pd

    from advisor.forecast.io import load

    _serve(
        monkeypatch,
        {
            "used": {"a100": ["0", "2.5", "9", "1000000000"], "h100": ["3", "3", "3", "3"]},
            "cap": {"a100": ["8", "8", "8", "1e9"], "h100": ["0", "4", "4", "4"]},
        },
    )
    panel = load("prometheus+http://prom:9090/?query=used&capacity=cap&by=pool")
    index = pd.date_range("2026-01-05 10:00", periods=4, freq="h")
    pd.testing.assert_frame_equal(
        panel.values,
        pd.DataFrame({"a100": [0.0, 2.5, 9.0, 1e9], "h100": [3.0] * 4}, index=index),
        check_freq=False,
        check_index_type=False,
    )
    pd.testing.assert_frame_equal(
        panel.capacity,
        pd.DataFrame({"a100": [8.0, 8.0, 8.0, 1e9], "h100": [0.0, 4.0, 4.0, 4.0]}, index=index),
        check_freq=False,
        check_index_type=False,
    )
