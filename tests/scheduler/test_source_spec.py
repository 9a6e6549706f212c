"""One SOURCE string names a scheduler and the usage source it joins."""

from __future__ import annotations

import pytest

from advisor.ingest import schedulers
from advisor.ingest.sources import SourceError, load_source


@pytest.mark.parametrize(
    ("spec", "parts"),
    [
        ("k8s:", ["k8s:"]),
        (
            "k8s:+http://a:9835/metrics,http://b:9835/metrics",
            ["k8s:", "http://a:9835/metrics,http://b:9835/metrics"],
        ),
        (
            "k8s:prod?rack-label=x/rack+prometheus+http://p:9090?history=1h",
            ["k8s:prod?rack-label=x/rack", "prometheus+http://p:9090?history=1h"],
        ),
        ("k8s:?tenant=label:a+b+https://n/metrics", ["k8s:?tenant=label:a+b", "https://n/metrics"]),
        ("prometheus+http://p:9090", ["prometheus+http://p:9090"]),
        ("http://a/metrics", ["http://a/metrics"]),
    ],
)
def test_split(spec, parts):
    assert schedulers.split(spec) == parts
    assert schedulers.split(schedulers.join(parts)) == parts


def test_combined_only_for_schedulers():
    assert schedulers.is_combined("k8s:+http://x")
    assert not schedulers.is_combined("prometheus+http://p:9090")
    assert not schedulers.is_combined("sim:a100-16x8")


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("k8s:+k8s:other", "one scheduler per source"),
        ("k8s:+http://a+http://b", "one usage source with a scheduler"),
    ],
)
def test_bad_combinations_are_one_line(spec, problem):
    with pytest.raises(SourceError, match=problem) as error:
        load_source(spec)
    assert "\n" not in str(error.value)
