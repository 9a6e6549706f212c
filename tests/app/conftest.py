"""AppTest helpers: a fresh app per test, started on a given source and page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests.fakes.waiting import CAP_S

MAIN = str(Path(__file__).resolve().parents[2] / "advisor" / "app" / "main.py")
PRESETS = ("sim:a100-16x8", "sim:mixed-h100-a100-v100", "sim:nvlink-islands")


@pytest.fixture(autouse=True)
def fresh_caches() -> Iterator[None]:
    """Streamlit caches are process-wide: clear them so no test sees another's sources."""
    st.cache_resource.clear()
    st.cache_data.clear()
    yield
    st.cache_resource.clear()
    st.cache_data.clear()


def open_app(source: str, page: str | None = None) -> AppTest:
    """The app on `source`, showing `page` (a file under views/, e.g. "views/fragmentation.py")."""
    at = AppTest.from_file(MAIN, default_timeout=CAP_S)  # a net: a page may run slow when loaded
    at.session_state["source"] = source
    at.run()
    if page is not None:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def frame_with(at: AppTest, column: str):  # -> pandas.DataFrame
    """The first dataframe on the page that has `column` (AppTest has no keys for tables)."""
    for element in at.dataframe:
        if column in element.value.columns:
            return element.value
    raise AssertionError(f"no dataframe with column {column!r}")
