"""Paired per-example comparison of two arms scored on the same examples.

Convention: ``a`` is the reference (e.g. the seed candidate), ``b`` the arm under test; every
difference is ``b - a``, higher scores are better, and wins/ties/losses are counted from
``b``'s side. This is the held-out table of the GEPA deep-research protocol: mean paired
change, bootstrap CI, Wilcoxon signed-rank p, paired t p, effect size dz, win/tie/loss.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from ._checks import as_paired
from .bootstrap import BootstrapMethod, mean_interval

WILCOXON_ZERO_METHOD = "pratt"
"""Zero differences (ties) are ranked together with the others and then dropped (Pratt 1959):
they occupy the lowest ranks, so they neither count for nor against either arm, but they do
shrink the ranks the real differences get. When *every* difference is zero the rank test has
nothing to rank and heldout reports p = 1.0 (no evidence of any difference) without calling
scipy, which would divide by zero."""


@dataclass(frozen=True)
class PairedComparison:
    """Summary of ``b - a`` over ``n`` paired examples.

    ``separable`` is True only when the bootstrap CI excludes 0 *and* the Wilcoxon p is below
    ``1 - ci_level``; requiring both stops a near-degenerate bootstrap on a handful of examples
    (e.g. 3 wins, 0 losses) from declaring a winner the rank test cannot support. ``verdict``
    says in one sentence which arm is better or why the data cannot separate them.

    Degenerate cases are defined, never NaN-by-accident: n = 1 gives a NaN CI, t p and dz;
    constant differences give a point CI, ``dz = 0`` (all zero) or ``+-inf``, and ``ttest_p =
    1.0`` (all zero) or ``0.0`` (constant non-zero, the limit as the spread goes to 0)."""

    n: int
    mean_a: float
    mean_b: float
    mean_diff: float
    ci_low: float
    ci_high: float
    ci_level: float
    ci_method: str
    wilcoxon_p: float
    wilcoxon_zero_method: str
    ttest_p: float
    dz: float
    wins: int
    ties: int
    losses: int
    separable: bool
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def wilcoxon_p(diff: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p for paired differences (scipy, ``zero_method="pratt"``,
    no continuity correction, ``method="auto"``); 1.0 when every difference is zero."""
    if not np.any(diff):
        return 1.0
    return float(scipy_stats.wilcoxon(diff, zero_method=WILCOXON_ZERO_METHOD, correction=False, method="auto").pvalue)


def paired_t_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided paired t p (``scipy.stats.ttest_rel``), defined when the differences are
    constant (see :class:`PairedComparison`)."""
    diff = b - a
    if diff.shape[0] < 2:
        return float("nan")
    if np.ptp(diff) == 0.0:
        return 1.0 if diff[0] == 0.0 else 0.0
    return float(scipy_stats.ttest_rel(b, a).pvalue)


def effect_size_dz(diff: np.ndarray) -> float:
    """Cohen's dz: mean difference over the standard deviation of the differences (ddof=1)."""
    if diff.shape[0] < 2:
        return float("nan")
    mean = float(diff.mean())
    if np.ptp(diff) == 0.0:
        return 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
    return mean / float(diff.std(ddof=1))


def paired_comparison(
    a: Any,
    b: Any,
    *,
    n_boot: int = 10_000,
    ci: float = 0.95,
    seed: int = 0,
    method: BootstrapMethod = "bca",
    labels: tuple[str, str] = ("a", "b"),
) -> PairedComparison:
    """Compare ``b`` against ``a`` example by example. ``a`` and ``b`` are 1-d arrays of finite
    scores in the same example order; NaN/inf, empty input or different lengths raise
    :class:`StatsInputError`. ``labels`` name the arms in the verdict sentence."""
    a_arr, b_arr = as_paired(a, b, labels)
    diff = b_arr - a_arr
    n = int(diff.shape[0])
    interval = mean_interval(diff, n_boot=n_boot, ci=ci, seed=seed, method=method)
    w_p = wilcoxon_p(diff)
    wins = int(np.count_nonzero(diff > 0))
    losses = int(np.count_nonzero(diff < 0))
    mean_diff = float(diff.mean())
    separable = interval.excludes(0.0) and w_p < 1.0 - interval.level
    return PairedComparison(
        n=n,
        mean_a=float(a_arr.mean()),
        mean_b=float(b_arr.mean()),
        mean_diff=mean_diff,
        ci_low=interval.low,
        ci_high=interval.high,
        ci_level=interval.level,
        ci_method=interval.method,
        wilcoxon_p=w_p,
        wilcoxon_zero_method=WILCOXON_ZERO_METHOD,
        ttest_p=paired_t_p(a_arr, b_arr),
        dz=effect_size_dz(diff),
        wins=wins,
        ties=n - wins - losses,
        losses=losses,
        separable=separable,
        verdict=_verdict(labels, n, mean_diff, interval.low, interval.high, interval.level, w_p, wins, losses, separable),
    )


def _verdict(
    labels: tuple[str, str],
    n: int,
    mean_diff: float,
    low: float,
    high: float,
    level: float,
    w_p: float,
    wins: int,
    losses: int,
    separable: bool,
) -> str:
    a_name, b_name = labels
    pct = f"{level:.0%}"
    counts = f"{wins} wins / {n - wins - losses} ties / {losses} losses for {b_name}"
    if n < 2:
        return f"cannot separate: only {n} paired example"
    if wins == 0 and losses == 0:
        return f"cannot separate: all {n} paired differences are 0"
    ci_text = f"{pct} CI [{low:+.4g}, {high:+.4g}]"
    if not separable:
        if not (low > 0.0 or high < 0.0):
            return f"cannot separate: {ci_text} includes 0 (mean change {mean_diff:+.4g}; {counts})"
        return (
            f"cannot separate: {ci_text} excludes 0 but Wilcoxon p={w_p:.3g} >= {1 - level:.3g} "
            f"(too few untied pairs; {counts})"
        )
    direction = "better" if mean_diff > 0 else "worse"
    return (
        f"{b_name} is {direction} than {a_name}: mean change {mean_diff:+.4g}, {ci_text}, "
        f"Wilcoxon p={w_p:.3g}; {counts}"
    )
