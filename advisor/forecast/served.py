"""Numbers and labels as the served forecast documents write them (JSON: None, never NaN)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpu_defrag_common.messages import one_line


def horizon_label(hours: int) -> str:
    return f"{hours}h"


def finite(value: float) -> float | None:
    """A served number: None where it is NaN (e.g. an interval quantile without an interval)."""
    return float(value) if np.isfinite(value) else None


def last_finite(column: np.ndarray) -> float | None:
    finite = column[np.isfinite(column)]
    return float(finite[-1]) if len(finite) else None


def ratio(percent: float) -> float | None:
    """metrics.wape is in percent; the contract's unit is a ratio. NaN (no actuals) -> None."""
    return float(percent) / 100.0 if np.isfinite(percent) else None


def label(ts: pd.Timestamp) -> str:
    return ts.isoformat() + "Z"


def message(error: BaseException) -> str:
    return one_line(error)
