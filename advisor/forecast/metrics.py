"""Point, probabilistic and decision metrics; NaN actuals (masked points) are ignored everywhere."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def _valid(y: ArrayLike, f: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    y, f = np.asarray(y, float), np.asarray(f, float)
    ok = np.isfinite(y) & np.isfinite(f)
    return y[ok], f[ok]


def mae(y: ArrayLike, f: ArrayLike) -> float:
    y, f = _valid(y, f)
    return float(np.mean(np.abs(y - f))) if len(y) else np.nan


def rmse(y: ArrayLike, f: ArrayLike) -> float:
    y, f = _valid(y, f)
    return float(np.sqrt(np.mean((y - f) ** 2))) if len(y) else np.nan


def wape(y: ArrayLike, f: ArrayLike) -> float:
    """Σ|y − f| / Σ|y| in percent."""
    y, f = _valid(y, f)
    denom = np.sum(np.abs(y))
    return float(100 * np.sum(np.abs(y - f)) / denom) if denom > 0 else np.nan


def smape(y: ArrayLike, f: ArrayLike) -> float:
    """Mean of 200·|y − f| / (|y| + |f|) in percent; a 0/0 term counts as 0 (zero-safe)."""
    y, f = _valid(y, f)
    if not len(y):
        return np.nan
    denom = np.abs(y) + np.abs(f)
    terms = np.divide(200 * np.abs(y - f), denom, out=np.zeros_like(y), where=denom > 0)
    return float(np.mean(terms))


def mase_scale(train: np.ndarray, season: int = 24) -> float:
    """In-sample mean |y[t] − y[t − season]| on the training part (masked pairs skipped)."""
    train = np.asarray(train, float)
    if len(train) <= season:
        return np.nan
    d = np.abs(train[season:] - train[:-season])
    d = d[np.isfinite(d)]
    return float(np.mean(d)) if len(d) else np.nan


def mase(y: ArrayLike, f: ArrayLike, scale: float) -> float:
    m = mae(y, f)
    return m / scale if scale and np.isfinite(scale) and scale > 0 else np.nan


def pinball(y: ArrayLike, fq: ArrayLike, q: float) -> float:
    """Mean quantile (pinball) loss of forecast quantile `fq` at level q."""
    y, fq = _valid(y, fq)
    if not len(y):
        return np.nan
    return float(np.mean(pinball_losses(y, fq, q)))


def pinball_losses(y: ArrayLike, fq: ArrayLike, q: float) -> np.ndarray:
    """The pinball loss of each point (NaN where either is NaN): what `pinball` averages."""
    d = np.asarray(y, float) - np.asarray(fq, float)
    return np.maximum(q * d, (q - 1) * d)


def headroom(y: ArrayLike, fq: ArrayLike) -> float:
    """Mean over-reservation max(fq − y, 0) of an upper quantile: what holding capacity at the
    quantile costs in idle units per step (the price of its coverage)."""
    y, fq = _valid(y, fq)
    return float(np.mean(np.maximum(fq - y, 0))) if len(y) else np.nan


def coverage(y: ArrayLike, fq: ArrayLike) -> float:
    """Share of actuals at or below the forecast quantile."""
    y, fq = _valid(y, fq)
    return float(np.mean(y <= fq)) if len(y) else np.nan


def release_scores(released: ArrayLike, truth: ArrayLike) -> dict[str, float]:
    """Idle-window release: capture Σmin(R, m)/Σm, violation share (R > m), mean shortfall."""
    r, m = _valid(released, truth)
    if not len(r):
        return {"capture": np.nan, "violation_rate": np.nan, "mean_shortfall": np.nan}
    total = np.sum(m)
    return {
        "capture": float(100 * np.sum(np.minimum(r, m)) / total) if total > 0 else np.nan,
        "violation_rate": float(100 * np.mean(r > m)),
        "mean_shortfall": float(np.mean(np.maximum(r - m, 0))),
    }
