"""Run scikit-learn's OpenMP code and the BLAS under it on a bounded number of threads.

The forecasting fits are small (thousands of rows); on a shared machine OpenMP threads that spin
at barriers while another process holds the core make them many times slower (the forecast test
suite took 5 minutes instead of 15 s on two busy cores). One thread by default;
`GPU_DEFRAG_FORECAST_THREADS` raises it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def bounded() -> Iterator[None]:
    # Load the native libraries first: a limit only reaches libraries already loaded.
    import sklearn.ensemble
    import sklearn.linear_model  # noqa: F401  (SciPy's BLAS)
    from threadpoolctl import threadpool_limits

    limit = max(1, int(os.environ.get("GPU_DEFRAG_FORECAST_THREADS", "1")))
    with threadpool_limits(limits=limit):  # OpenMP and BLAS alike
        yield
