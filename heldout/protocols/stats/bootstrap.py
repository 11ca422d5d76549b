"""Bootstrap intervals for a mean, vectorised over an index (or count) matrix.

Every resampling here is seeded (``numpy.random.default_rng(seed)``) so a report recomputed
from the same run records prints the same interval. Resample matrices are built in chunks so
memory stays bounded (about ``CHUNK_CELLS`` integers at a time) whatever ``n * n_boot`` is.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as scipy_stats
from scipy.special import ndtr, ndtri

from ._checks import StatsInputError, check_level, check_n_boot

BootstrapMethod = Literal["bca", "percentile"]
CHUNK_CELLS = 1 << 22
KEPT_RESAMPLE_CELLS = 1 << 20
"""A seeded resample index matrix up to this many cells (8 MiB) is drawn once and kept, read-only,
for the next interval of the same size and seed (simulations and reports ask for thousands)."""


@dataclass(frozen=True)
class Interval:
    """A two-sided confidence interval for a mean. ``method`` is the method actually used:
    ``"bca"``, ``"percentile"``, ``"degenerate"`` (every value equal, so every resample has the
    same mean and the interval is that single point) or ``"undefined"`` (n < 2: one value
    cannot say how much the mean would move; both ends are NaN)."""

    low: float
    high: float
    level: float
    method: str

    def excludes(self, value: float) -> bool:
        """True iff the interval is defined and ``value`` lies strictly outside it."""
        return bool(np.isfinite(self.low) and np.isfinite(self.high) and (value < self.low or value > self.high))


def bootstrap_means(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` means of ``values`` resampled with replacement (one row of indices per
    resample)."""
    n = values.shape[0]
    rows_per_chunk = max(1, CHUNK_CELLS // max(n, 1))
    out = np.empty(n_boot, dtype=np.float64)
    for start in range(0, n_boot, rows_per_chunk):
        stop = min(n_boot, start + rows_per_chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = values[idx].mean(axis=1)
    return out


@functools.lru_cache(maxsize=4)
def seeded_resamples(n: int, n_boot: int, seed: int) -> np.ndarray:
    """The index matrix :func:`bootstrap_means` draws first from ``default_rng(seed)`` (one chunk:
    ``n * n_boot <= KEPT_RESAMPLE_CELLS``), kept read-only."""
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    idx.flags.writeable = False
    return idx


def resample_counts(rng: np.random.Generator, k: int, rows: int) -> np.ndarray:
    """``rows`` x ``k`` matrix: how often each of ``k`` units is drawn in each resample of size
    ``k`` with replacement. Same law as ``rng.multinomial(k, [1/k]*k, rows)``, but built from
    one index matrix and a single ``bincount``, which is many times faster for large ``k``."""
    idx = rng.integers(0, k, size=(rows, k)) + (np.arange(rows) * k)[:, None]
    return np.bincount(idx.ravel(), minlength=rows * k).reshape(rows, k)


def percentile_interval(boot: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(boot, [tail, 1.0 - tail])
    return float(low), float(high)


def bca_acceleration(values: np.ndarray) -> float:
    """Jackknife estimate of the BCa acceleration for the mean. The leave-one-out means have a
    closed form, so no n x n matrix is built."""
    n = values.shape[0]
    loo = (values.sum() - values) / (n - 1)
    u = loo.mean() - loo
    denom = 6.0 * np.sum(u * u) ** 1.5
    return float(np.sum(u**3) / denom) if denom > 0 else 0.0


def bca_interval(values: np.ndarray, boot: np.ndarray, level: float) -> tuple[float, float] | None:
    """Bias-corrected and accelerated interval (Efron 1987), expanded for small samples. The bias
    correction uses the mid-rank of the observed mean among the resampled means (ties count
    half), the acceleration the jackknife. The normal quantiles are replaced by
    ``sqrt(n / (n - 1)) * t_{n-1}`` ones (Hesterberg's expansion: resampled means have the
    divisor-n spread and a normal tail, both too narrow at small n); at n = 50 this moves the
    simulated coverage on skewed differences from 0.925-0.96 to 0.93-0.965, and it vanishes as n
    grows. Returns None when the correction is undefined (then use the percentile one)."""
    theta = values.mean()
    below = np.count_nonzero(boot < theta) + 0.5 * np.count_nonzero(boot == theta)
    z0 = ndtri(below / boot.shape[0])
    accel = bca_acceleration(values)
    n = values.shape[0]
    q = math.sqrt(n / (n - 1)) * float(scipy_stats.t.ppf(0.5 + level / 2.0, n - 1))
    z = np.array([-q, q])
    with np.errstate(divide="ignore", invalid="ignore"):
        adjusted = ndtr(z0 + (z0 + z) / (1.0 - accel * (z0 + z)))
    if not np.all(np.isfinite(adjusted)):
        return None
    low, high = np.quantile(boot, adjusted)
    return float(low), float(high)


def mean_interval(
    values: np.ndarray,
    *,
    n_boot: int = 10_000,
    ci: float = 0.95,
    seed: int = 0,
    method: BootstrapMethod = "bca",
) -> Interval:
    """Bootstrap interval for ``values.mean()`` (``values`` already checked: 1-d, finite)."""
    level = check_level(ci)
    n_boot = check_n_boot(n_boot)
    if method not in ("bca", "percentile"):
        raise StatsInputError(f"method must be 'bca' or 'percentile', got {method!r}")
    if values.shape[0] < 2:
        return Interval(float("nan"), float("nan"), level, "undefined")
    if np.ptp(values) == 0.0:
        point = float(values[0])
        return Interval(point, point, level, "degenerate")
    n = values.shape[0]
    if n * n_boot <= KEPT_RESAMPLE_CELLS:  # the same resamples as a fresh draw, without drawing them again
        boot = values[seeded_resamples(n, n_boot, seed)].mean(axis=1)
    else:
        boot = bootstrap_means(values, n_boot, np.random.default_rng(seed))
    if method == "bca":
        bounds = bca_interval(values, boot, level)
        if bounds is not None:
            return Interval(*bounds, level, "bca")
    return Interval(*percentile_interval(boot, level), level, "percentile")
