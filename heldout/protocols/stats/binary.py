"""Paired 0/1 outcomes (one run per arm, each example solved or not): exact tests and a score
interval for the difference of the two proportions.

With 0/1 scores only the discordant pairs carry evidence: ``b`` examples the new arm solves and
the reference does not, ``c`` the reverse. The exact McNemar test is the binomial test of ``b``
out of ``b + c`` at 1/2 (statsmodels ``mcnemar(exact=True)``); 4 wins / 196 ties / 0 losses give
p = 0.125, not the 0.0455 a normal approximation claims.

The interval for ``p_b - p_a`` is Tango's (1998) score interval: the set of differences the
paired score test does not reject, found by root-finding. Its coverage stays near nominal down
to a few dozen pairs, where bootstrap intervals of 0/1 differences under-cover badly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import optimize
from scipy.special import ndtri
from scipy.stats import binomtest
from statsmodels.stats.contingency_tables import mcnemar

from ._checks import StatsInputError, as_paired, check_level


def is_binary(*arrays: np.ndarray) -> bool:
    """True iff every score is exactly 0 or 1."""
    return all(bool(np.all((a == 0.0) | (a == 1.0))) for a in arrays)


@dataclass(frozen=True)
class PairedBinary:
    """Counts of a paired 0/1 comparison (``b`` new-only successes, ``c`` reference-only) with
    the exact McNemar p (two-sided), exact one-sided sign-test p-values and Tango's interval."""

    n: int
    both: int
    b: int
    c: int
    neither: int
    difference: float
    p_exact: float
    p_less: float
    p_greater: float
    ci_low: float
    ci_high: float
    ci_level: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tango_statistic(b: int, c: int, n: int, delta: float) -> float:
    """Tango's score statistic for H0 ``p_b - p_c = delta`` (``b``, ``c`` discordant counts of
    ``n`` pairs), using the restricted maximum-likelihood estimate of the reverse cell."""
    a_coef = 2.0 * n
    b_coef = -b - c + (2.0 * n - b + c) * delta
    c_coef = -c * delta * (1.0 - delta)
    disc = max(b_coef * b_coef - 4.0 * a_coef * c_coef, 0.0)
    q21 = (math.sqrt(disc) - b_coef) / (2.0 * a_coef)
    var = n * (2.0 * q21 + delta * (1.0 - delta))
    if var <= 0:
        gap = b - c - n * delta
        return 0.0 if gap == 0 else math.copysign(math.inf, gap)
    return (b - c - n * delta) / math.sqrt(var)


def tango_interval(b: int, c: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Two-sided ``level`` score interval for the paired difference of proportions
    ``(b - c) / n`` (Tango 1998)."""
    level = check_level(level)
    if n < 1:
        raise StatsInputError("tango_interval needs at least one pair")
    z = float(ndtri(1.0 - (1.0 - level) / 2.0))
    point = (b - c) / n
    eps = 1e-12

    def excess(delta: float) -> float:
        return tango_statistic(b, c, n, delta)

    # The statistic falls from +inf at -1 to -inf at +1; each bound is a root of |T| = z.
    low = -1.0 if excess(-1.0 + eps) <= z else optimize.brentq(lambda d: excess(d) - z, -1.0 + eps, point, xtol=1e-12)
    high = 1.0 if excess(1.0 - eps) >= -z else optimize.brentq(lambda d: excess(d) + z, point, 1.0 - eps, xtol=1e-12)
    return float(low), float(high)


def paired_binary(a: Any, b: Any, *, ci: float = 0.95) -> PairedBinary:
    """``b`` against ``a`` on paired 0/1 scores (1-d, same example order)."""
    ref, new = as_paired(a, b, ("a", "b"))
    if not is_binary(ref, new):
        raise StatsInputError("paired_binary needs scores that are exactly 0 or 1")
    level = check_level(ci)
    n = int(ref.shape[0])
    wins = int(np.count_nonzero((new == 1) & (ref == 0)))
    losses = int(np.count_nonzero((new == 0) & (ref == 1)))
    both = int(np.count_nonzero((new == 1) & (ref == 1)))
    discordant = wins + losses
    if discordant:
        table = [[both, wins], [losses, n - both - wins - losses]]
        p_exact = float(mcnemar(table, exact=True).pvalue)
        p_less = float(binomtest(wins, discordant, 0.5, alternative="less").pvalue)
        p_greater = float(binomtest(wins, discordant, 0.5, alternative="greater").pvalue)
    else:
        p_exact = p_less = p_greater = 1.0
    low, high = tango_interval(wins, losses, n, level)
    return PairedBinary(n, both, wins, losses, n - both - discordant, (wins - losses) / n, p_exact, p_less,
                        p_greater, low, high, level)
