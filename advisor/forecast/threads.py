"""Run scikit-learn's OpenMP code and the BLAS under it on a bounded number of threads.

The forecasting fits are small (thousands of rows); on a shared machine OpenMP threads that spin
at barriers while another process holds the core make them many times slower (the forecast test
suite took 5 minutes instead of 15 s on two busy cores). One thread by default;
`GPU_DEFRAG_FORECAST_THREADS` raises it.

The libraries are found once per process (`_controller`): `threadpool_limits` walks every loaded
shared object on each call (about 4 ms), and every fit and prediction enters `bounded`, about
830 times in the Philly backtest, so the walk alone cost about 3 s of CPU there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any


@cache
def _controller() -> Any:
    """The thread pools of this process's native libraries, looked up once."""
    # Load the native libraries first: a limit only reaches libraries already loaded.
    import sklearn.ensemble
    import sklearn.linear_model  # noqa: F401  (SciPy's BLAS)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextmanager
def bounded() -> Iterator[None]:
    limit = max(1, int(os.environ.get("GPU_DEFRAG_FORECAST_THREADS", "1")))
    with _controller().limit(limits=limit):  # OpenMP and BLAS alike
        yield
