"""How many paired examples (or seeds) an effect needs: the one-sample t power of the paired
differences (``statsmodels.stats.power.TTestPower``), with effect size Cohen's dz."""

from __future__ import annotations

import math
import warnings
from typing import Literal

import numpy as np
from statsmodels.stats.power import TTestPower
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from ._checks import StatsInputError, check_alpha

Alternative = Literal["two-sided", "one-sided"]


def _alternative(alternative: str) -> str:
    if alternative not in ("two-sided", "one-sided"):
        raise StatsInputError(f"alternative must be 'two-sided' or 'one-sided', got {alternative!r}")
    # statsmodels names the one-sided test by its direction; |dz| is used, so "larger".
    return "two-sided" if alternative == "two-sided" else "larger"


def _check_dz(dz: float) -> float:
    if not math.isfinite(dz) or dz == 0.0:
        raise StatsInputError(f"dz must be a finite, non-zero effect size, got {dz!r}")
    return abs(float(dz))


def _check_power(power: float) -> float:
    if not 0.0 < power < 1.0:
        raise StatsInputError(f"power must be strictly between 0 and 1, got {power!r}")
    return float(power)


def required_sample_size(
    dz: float, *, alpha: float = 0.05, power: float = 0.8, alternative: Alternative = "two-sided"
) -> int:
    """Smallest number of pairs (examples, or seeds when the unit is a whole run) for a paired t
    test at ``alpha`` to detect an effect of size ``dz`` with probability ``power``. Never
    below 2: one pair has no spread to test against. (For very large effects scipy's noncentral
    t is NaN at one degree of freedom; the answer then errs up, to 3 pairs instead of 2.)"""
    effect = _check_dz(dz)
    alpha = check_alpha(alpha)
    power = _check_power(power)
    solver = TTestPower()
    side = _alternative(alternative)

    def reaches(n: int) -> bool:
        return solver.power(effect_size=effect, nobs=n, alpha=alpha, alternative=side) >= power

    with warnings.catch_warnings():
        # statsmodels' root finder fails (NaN + ConvergenceWarning) when the answer is a
        # handful of pairs; the integer walk below then finds it directly.
        warnings.simplefilter("ignore", ConvergenceWarning)
        solved = solver.solve_power(effect_size=effect, nobs=None, alpha=alpha, power=power, alternative=side)
    n = max(2, math.ceil(float(solved))) if np.isfinite(solved) else 2
    # Settle on the smallest integer: power rises with n, the float root may sit a hair off.
    while n > 2 and reaches(n - 1):
        n -= 1
    while not reaches(n):
        n += 1
    return n


def achieved_power(dz: float, n: int, *, alpha: float = 0.05, alternative: Alternative = "two-sided") -> float:
    """Probability that a paired t test on ``n`` pairs at ``alpha`` detects an effect ``dz``
    (NaN where scipy's noncentral t cannot evaluate it: n = 2 with |dz| roughly 5 to 30)."""
    effect = _check_dz(dz)
    if int(n) != n or n < 2:
        raise StatsInputError(f"n must be an integer >= 2, got {n!r}")
    return float(TTestPower().power(effect_size=effect, nobs=int(n), alpha=check_alpha(alpha), alternative=_alternative(alternative)))


def minimum_detectable_dz(
    n: int, *, alpha: float = 0.05, power: float = 0.8, alternative: Alternative = "two-sided"
) -> float:
    """Smallest |dz| that ``n`` pairs detect with probability ``power`` at ``alpha``: what a
    report can honestly say a null result rules out."""
    if int(n) != n or n < 2:
        raise StatsInputError(f"n must be an integer >= 2, got {n!r}")
    return float(
        TTestPower().solve_power(
            effect_size=None, nobs=int(n), alpha=check_alpha(alpha), power=_check_power(power), alternative=_alternative(alternative)
        )
    )
