"""Durations and sizes: one parser for every flag and source option."""

import argparse

import pytest

from gpu_defrag_common.units import duration, positive_duration, size


def test_durations_and_sizes_parse_one_way():
    assert [duration(t) for t in ("15", "15s", "500ms", "2m", "1h", "2d")] == [
        15.0,
        15.0,
        0.5,
        120.0,
        3600.0,
        172800.0,
    ]
    assert size("10GiB") == 10 * 2**30 and size("512") == 512
    assert positive_duration("10s") == 10.0
    for bad, parse in (("1w", duration), ("-1s", duration), ("0", positive_duration)):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            parse(bad)
