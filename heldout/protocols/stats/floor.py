"""The noise floor of a comparison with a fixed candidate: a method's runs against placebo draws.

A fixed candidate (the seed prompt) scored once is one draw of "that candidate, worded some way":
on a worker whose answers to some questions flip with any change of wording, its score carries
luck that no number of seeds averages out, and every seed pair shares it. The floor replaces that
one draw with ``K`` placebo draws per seed (neutral re-wordings, :mod:`heldout.optimizers.placebo`)
and asks whether the method's run of seed ``s`` stands out among the ``K + 1`` candidates of its
stratum.

**The test: an exact stratified permutation.** Stratum ``s`` holds the method's value ``m_s`` and
its own placebo draws ``p_s1 .. p_sK`` (fresh draws per stratum, so strata are independent).
Under the null "the method is a placebo" (its final candidate is as good as a neutral re-wording
of the seed) the ``K + 1`` values of a stratum are exchangeable, whatever their law (skewed,
two-valued, heavy-tailed) and however the questions inside one candidate's score move together.
The statistic is the mean over strata of ``m_s - mean(p_s)``; its null law is the mean over strata
of ``v_j - mean(v_-j)`` with ``j`` uniform in each stratum, enumerated exactly over the
``prod(K_s + 1)`` choices (Monte Carlo above the permutation test's exact limit,
:data:`heldout.protocols.stats.runs.EXACT_PERMUTATION_MAX`). The smallest
two-sided p is ``2 / prod(K_s + 1)``: 3 seeds x 9 draws reach 0.002.

A shifted null ``m = p + theta`` (test ``m_s - theta`` against the draws) gives one-sided p-values
and, inverted, a confidence interval for the method's gain beyond the floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ._checks import StatsInputError, check_alpha
from .runs import EXACT_PERMUTATION_MAX, MONTE_CARLO_DRAWS, Side, invert_linear_law, tie_tolerance


def _strata(method: Sequence[float], placebo: Sequence[Sequence[float]]) -> list[np.ndarray]:
    """Each stratum as one array, the method's value first."""
    if len(method) != len(placebo):
        raise StatsInputError(f"{len(method)} method values but {len(placebo)} strata of placebo draws")
    strata = []
    for m, draws in zip(method, placebo):
        values = np.asarray([float(m), *map(float, draws)])
        if values.size < 2:
            raise StatsInputError("every stratum needs >= 1 placebo draw")
        if not np.all(np.isfinite(values)):
            raise StatsInputError("placebo floor values must be finite")
        strata.append(values)
    return strata


def arrangements(draws_per_stratum: Sequence[int]) -> int:
    """How many equally likely arrangements the null has: ``prod(K_s + 1)``."""
    return math.prod(int(k) + 1 for k in draws_per_stratum)


def smallest_p(draws_per_stratum: Sequence[int]) -> float:
    """The smallest two-sided p the design can print (every stratum's method at one extreme)."""
    n = arrangements(draws_per_stratum)
    return min(1.0, 2.0 / n) if n else 1.0


def draws_needed(n_strata: int, alpha: float, *, family: int = 1, spare: float = 4.0) -> int:
    """Placebo draws per stratum so that the smallest two-sided p is below ``alpha / family``
    with room (``spare`` times below), at least 1."""
    level = check_alpha(alpha) / max(1, family) / spare
    k = 1
    while 2.0 / (k + 1) ** max(1, n_strata) > level:
        k += 1
    return k


@dataclass(frozen=True)
class FloorLaw:
    """The null law of one comparison, enumerated once (:func:`floor_law`): every arrangement's
    statistic as a line in the shift ``theta``. The arrangement that lets value ``j_s`` of each
    stratum play the method has statistic ``B + theta * A`` against the observed ``T - theta``, so
    it reaches the observed value from above or below depending on ``h + theta * g`` with
    ``h = B - T`` and ``g = A + 1 >= 0`` (0 only for the observed arrangement)."""

    h: np.ndarray
    g: np.ndarray
    slack: float
    gain: float
    """The estimate: mean over strata of the method's value minus the mean of its stratum's draws."""

    def p(self, theta0: float, side: Side) -> float:
        """One-sided p for H1 ``gain > theta0`` (``"greater"``) or ``gain < theta0`` (``"less"``)."""
        moved = self.h + theta0 * self.g
        hits = np.sum(moved >= -self.slack) if side == "greater" else np.sum(moved <= self.slack)
        return float(hits / self.h.size)

    def bound(self, alpha: float, side: Side) -> float:
        """The one-sided ``1 - alpha`` bound on the gain, :meth:`p` inverted exactly: the lower bound
        for ``side="greater"``, the upper for ``"less"``; infinite when no shift can be rejected."""
        return invert_linear_law(self.h, self.g, alpha, side, self.slack)


def floor_law(method: Sequence[float], placebo: Sequence[Sequence[float]], *, seed: int = 0) -> FloorLaw:
    """The stratified permutation law of ``method`` (one value per stratum) against ``placebo``
    (that stratum's draws): all arrangements, or random ones (the observed one included) above
    :data:`~heldout.protocols.stats.runs.EXACT_PERMUTATION_MAX`."""
    strata = _strata(method, placebo)
    b_parts, a_parts = [], []
    for v in strata:
        k = v.size - 1
        b_parts.append(((k + 1) * v - v.sum()) / k)  # v_j - mean(v_-j)
        a_parts.append(np.r_[-1.0, np.full(k, 1.0 / k)])  # how each contribution moves with the shift
    observed = float(np.mean([b[0] for b in b_parts]))
    if arrangements([v.size - 1 for v in strata]) <= EXACT_PERMUTATION_MAX:
        big, slope = np.zeros(1), np.zeros(1)
        for b, a in zip(b_parts, a_parts):
            big, slope = (big[:, None] + b[None, :]).ravel(), (slope[:, None] + a[None, :]).ravel()
    else:
        rng = np.random.default_rng(seed)
        picks = [np.r_[0, rng.integers(0, b.size, MONTE_CARLO_DRAWS)] for b in b_parts]  # observed first
        big = np.sum([b[p] for b, p in zip(b_parts, picks)], axis=0)
        slope = np.sum([a[p] for a, p in zip(a_parts, picks)], axis=0)
    m = len(strata)
    return FloorLaw(h=big / m - observed, g=slope / m + 1.0, slack=tie_tolerance(*strata) * 2, gain=observed)


__all__ = ["FloorLaw", "arrangements", "draws_needed", "floor_law", "smallest_p"]
