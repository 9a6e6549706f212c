"""Skip or fail: a test that needs an optional tool skips where it is missing, except under CI,
where a missing tool is a failure rather than a silently skipped test.

CI counts as set when the CI variable holds a truthy word: 1, true, yes or on, in any case
(GitHub Actions and GitLab set "true", others "1" or "True"). Anything else, unset included,
is a developer's machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

import pytest

TRUTHY = frozenset({"1", "true", "yes", "on"})


def under_ci(environ: Mapping[str, str] | None = None) -> bool:
    """Whether `environ` (default: this process's environment) says the run is CI."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() in TRUTHY


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test for `reason`; under CI fail it instead."""
    if under_ci():
        pytest.fail(f"{reason} (CI={os.environ['CI']}: not skipping)")
    pytest.skip(reason)
