"""The shared skip-or-fail rule for tests that need an optional tool."""

from __future__ import annotations

import re

import pytest

from tests.ci import skip_or_fail, under_ci


@pytest.mark.parametrize("value", ["1", "true", "True", "TRUE", "yes", "Yes", "on", "ON", " true "])
def test_truthy_words_mean_ci(value, monkeypatch):
    assert under_ci({"CI": value})
    monkeypatch.setenv("CI", value)
    assert under_ci()
    with pytest.raises(
        pytest.fail.Exception, match=rf"^no tool \(CI={re.escape(value)}: not skipping\)$"
    ):
        skip_or_fail("no tool")


@pytest.mark.parametrize("value", [None, "", "0", "false", "False", "no", "off", "maybe"])
def test_anything_else_is_not_ci(value, monkeypatch):
    environ = {} if value is None else {"CI": value}
    assert not under_ci(environ)
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not under_ci()
    with pytest.raises(pytest.skip.Exception, match=r"^no tool$"):
        skip_or_fail("no tool")
