"""Errors as one line: the text folded, with its type where asked or where it has no text."""

from __future__ import annotations

import pytest

from gpu_defrag_common.messages import one_line


@pytest.mark.parametrize(
    ("error", "plain", "typed"),
    [
        (ValueError("bad thing\n  second   line\n"), "bad thing second line", None),
        (KeyError(), "KeyError", "KeyError"),
        (OSError(), "OSError", "OSError"),
        (ValueError("   \n"), "ValueError", "ValueError"),
    ],
)
def test_one_line_folds_the_text_and_names_the_type_when_asked(error, plain, typed):
    assert one_line(error) == plain
    assert one_line(error, typed=True) == (typed or f"{type(error).__name__}: {plain}")
