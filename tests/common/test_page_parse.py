"""Reading exposition pages line by line where they do not parse whole (`page_parse`)."""

from __future__ import annotations

import pytest

from gpu_defrag_common.page_parse import PageError, first_bad_line, parse_page, shorten

GOOD = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 41'
FAILED = 'DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION{gpu="0",UUID="GPU-a"} ERROR - FAILED TO CONVERT TO STRING'


def test_a_page_that_parses_whole_is_read_in_one_pass():
    samples, skipped = parse_page(f"# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n{GOOD}\n")
    assert samples == [("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0", "UUID": "GPU-a"}, 41.0)]
    assert skipped is None


def test_unparseable_lines_are_left_out_counted_and_the_first_named():
    page = "\n".join([GOOD, FAILED, GOOD.replace('"0"', '"1"'), FAILED.replace('"0"', '"1"')])
    samples, skipped = parse_page(page + "\n")
    assert [s[1]["gpu"] for s in samples] == ["0", "1"]
    assert (skipped.count, skipped.first_number) == (2, 2)
    assert "could not convert string to float: 'ERROR'" in skipped.first_error
    text = skipped.describe()
    assert text.startswith("line 2: could not convert") and "FAILED TO CONVERT TO STRING" in text


def test_a_line_that_fails_only_in_its_page_is_found_by_bisection():
    """A comment line is not asked about alone; an invalid TYPE fails the page, and the
    bisection names it."""
    page = f"# TYPE DCGM_FI_DEV_X bogus\n{GOOD}\n{FAILED}\n"
    samples, skipped = parse_page(page)
    assert len(samples) == 1 and skipped.count == 2 and skipped.first_number == 1
    assert "Invalid metric type" in skipped.first_error


def test_a_page_of_which_no_line_parses_is_refused_naming_its_first_line():
    with pytest.raises(PageError, match=r"^malformed exposition text at line 1: "):
        parse_page("<html><body>502 Bad Gateway</body></html>\n<p>nginx</p>\n")


def test_long_lines_are_shown_with_their_start_and_their_end():
    shown = shorten(FAILED)
    assert len(shown) < len(FAILED) and shown.startswith("DCGM_FI_DEV_VGPU")
    assert shown.endswith("TO STRING") and " ... " in shown
    assert shorten(GOOD) == GOOD


def test_first_bad_line_is_none_for_a_page_that_parses():
    assert first_bad_line(f"{GOOD}\n") is None
    assert first_bad_line(f"{GOOD}\n{FAILED}\n") == 2
