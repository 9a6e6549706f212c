"""`threads.bounded`: the fits run on the bounded number of threads, and the limit is undone."""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_info

from advisor.forecast.threads import bounded


def _openmp_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "openmp"]


def test_bounded_limits_openmp_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_DEFRAG_FORECAST_THREADS", "2")
    with bounded():  # loads scikit-learn's OpenMP runtime
        pass
    before = _openmp_threads()
    assert before, "scikit-learn's OpenMP runtime is loaded by bounded()"
    for limit in (1, 2, 1):  # the cached controller serves every call, nested ones too
        monkeypatch.setenv("GPU_DEFRAG_FORECAST_THREADS", str(limit))
        with bounded():
            assert set(_openmp_threads()) == {limit}
            with bounded():
                assert set(_openmp_threads()) == {limit}
        assert _openmp_threads() == before
