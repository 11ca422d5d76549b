"""Paired per-example comparison of two arms scored on the same examples.

Convention: ``a`` is the reference (e.g. the seed candidate), ``b`` the arm under test; every
difference is ``b - a``, higher scores are better unless the metric says lower
(``higher_is_better=False``), and wins/ties/losses are counted from ``b``'s side. This is the
held-out table of the GEPA deep-research protocol: mean paired
change, bootstrap CI, Wilcoxon signed-rank p, paired t p, effect size dz, win/tie/loss.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats as scipy_stats

from ._checks import StatsInputError, as_paired, check_level
from .binary import is_binary, paired_binary
from .bootstrap import mean_interval
from .runs import snap_ties, tie_tolerance

CiMethod = Literal["t", "tango", "bca", "percentile"]

WILCOXON_ZERO_METHOD = "pratt"
"""Zero differences (ties, within the tie tolerance of :mod:`.runs`) are ranked together with
the others and then dropped (Pratt 1959): they occupy the lowest ranks, so they neither count
for nor against either arm, but they do shrink the ranks the real differences get. When *every*
difference is zero the rank test has nothing to rank and heldout reports p = 1.0."""

WILCOXON_EXACT_MAX = 25
"""The Wilcoxon method is fixed, never scipy's version-dependent ``"auto"``: with at most this
many non-zero differences, the exact sign-flip distribution of the Pratt signed-rank statistic
(mid-ranks for tied magnitudes, all 2**n sign patterns, counted by convolution); above it, the normal
approximation with tie correction and no continuity correction (scipy ``method="approx"``)."""


@dataclass(frozen=True)
class PairedComparison:
    """Summary of ``b - a`` over ``n`` paired examples (one run per arm: this says nothing about
    run-to-run variance; see :mod:`.runs` for that).

    ``exact_test`` / ``exact_p`` is the test the verdict rests on: exact McNemar for 0/1 scores,
    the fixed-method Wilcoxon signed-rank test otherwise. ``ci_method`` is ``"tango"`` (score
    interval for 0/1 scores), ``"bca"`` (the seeded BCa bootstrap, the default for other scores),
    ``"t"`` (paired t) or ``"percentile"`` on request; ``ci_note`` says when the interval may
    under-cover (strongly skewed differences at this n), else it is empty. ``separable`` is True only when the CI excludes 0 *and* ``exact_p`` is
    below ``1 - ci_level``. Differences within the tie tolerance count as ties everywhere.

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
    exact_test: str
    exact_p: float
    wilcoxon_p: float
    wilcoxon_method: str
    wilcoxon_zero_method: str
    ttest_p: float
    dz: float
    wins: int
    ties: int
    losses: int
    separable: bool
    verdict: str
    ci_note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def wilcoxon_test(diff: np.ndarray) -> tuple[float, str]:
    """Two-sided Wilcoxon signed-rank p for paired differences (ties already snapped to 0) and
    the method used (see ``WILCOXON_EXACT_MAX``); ``(1.0, "none")`` when every difference is 0."""
    nonzero = np.count_nonzero(diff)
    if nonzero == 0:
        return 1.0, "none"
    if nonzero > WILCOXON_EXACT_MAX:
        res = scipy_stats.wilcoxon(diff, zero_method=WILCOXON_ZERO_METHOD, correction=False, method="approx")
        return float(res.pvalue), "normal approximation"
    ranks = scipy_stats.rankdata(np.abs(diff))
    kept = diff != 0
    # Mid-ranks are multiples of 1/2: on doubled ranks the null law of the positive-rank sum is
    # an integer convolution of {0, 2r} over the non-zero differences (all 2**n sign patterns).
    doubled = np.rint(2 * ranks[kept]).astype(np.int64)
    counts = np.zeros(int(doubled.sum()) + 1)
    counts[0] = 1.0
    for r in doubled:
        counts[r:] = counts[r:] + counts[: counts.shape[0] - r].copy()
    null = counts / counts.sum()
    observed = int(np.rint(2 * ranks[kept][diff[kept] > 0].sum()))
    lower, upper = float(null[: observed + 1].sum()), float(null[observed:].sum())
    return float(min(1.0, 2.0 * min(lower, upper))), "exact sign-flip"


def wilcoxon_p(diff: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p (fixed method, Pratt zeros); 1.0 when all are zero."""
    return wilcoxon_test(diff)[0]


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


def t_interval(diff: np.ndarray, level: float) -> tuple[float, float]:
    """Two-sided paired t interval for the mean difference (``scipy.stats.ttest_1samp``'s)."""
    if diff.shape[0] < 2:
        return float("nan"), float("nan")
    if np.ptp(diff) == 0.0:
        return float(diff[0]), float(diff[0])
    ci = scipy_stats.ttest_1samp(diff, 0.0).confidence_interval(confidence_level=level)
    return float(ci.low), float(ci.high)


def paired_comparison(
    a: Any,
    b: Any,
    *,
    n_boot: int = 10_000,
    ci: float = 0.95,
    seed: int = 0,
    method: CiMethod | None = None,
    labels: tuple[str, str] = ("a", "b"),
    higher_is_better: bool = True,
) -> PairedComparison:
    """Compare ``b`` against ``a`` example by example. ``a`` and ``b`` are 1-d arrays of finite
    scores in the same example order; NaN/inf, empty input or different lengths raise
    :class:`StatsInputError`. ``labels`` name the arms in the verdict sentence. ``method`` picks
    the interval; by default Tango's score interval for 0/1 scores (bootstraps of 0/1 differences
    do not hold their level) and the seeded, small-sample-expanded BCa bootstrap otherwise: on
    five skewed shapes of continuous differences at n = 50 it covers 0.936-0.951 where the t
    interval covers 0.913-0.941 (``tests/test_stats_simulation.py``). For lognormal tails no
    mean interval holds 0.95 at n = 50 (BCa 0.90, t 0.89): ``ci_note`` then says so, by
    Cochran's rule (n <= 25 g1**2, g1 the differences' sample skewness). ``higher_is_better``
    (the metric's direction) decides only which differences are wins and the word "better"."""
    a_arr, b_arr = as_paired(a, b, labels)
    level = check_level(ci)
    diff = snap_ties(b_arr - a_arr, tie_tolerance(a_arr, b_arr))
    n = int(diff.shape[0])
    binary = is_binary(a_arr, b_arr)
    chosen = method or ("tango" if binary else "bca")
    if chosen == "tango" and not binary:
        raise StatsInputError("method 'tango' needs scores that are exactly 0 or 1")
    pb = paired_binary(a_arr, b_arr, ci=level) if binary else None
    if chosen == "tango":
        low, high, ci_method = pb.ci_low, pb.ci_high, "tango"
    elif chosen == "t":
        low, high = t_interval(diff, level)
        ci_method = "undefined" if n < 2 else ("degenerate" if np.ptp(diff) == 0 else "t")
    elif chosen in ("bca", "percentile"):
        interval = mean_interval(diff, n_boot=n_boot, ci=level, seed=seed, method=chosen)
        low, high, ci_method = interval.low, interval.high, interval.method
    else:
        raise StatsInputError(f"method must be one of 't', 'tango', 'bca', 'percentile', got {method!r}")
    w_p, w_method = wilcoxon_test(diff)
    ci_note = "" if binary or chosen == "tango" else skew_note(diff)
    exact_test, exact_p = ("exact McNemar", pb.p_exact) if pb is not None else (f"Wilcoxon ({w_method})", w_p)
    better = diff if higher_is_better else -diff
    wins = int(np.count_nonzero(better > 0))
    losses = int(np.count_nonzero(better < 0))
    mean_diff = float(diff.mean())
    excludes = bool(np.isfinite(low) and np.isfinite(high) and (low > 0.0 or high < 0.0))
    separable = excludes and exact_p < 1.0 - level
    return PairedComparison(
        n=n,
        mean_a=float(a_arr.mean()),
        mean_b=float(b_arr.mean()),
        mean_diff=mean_diff,
        ci_low=float(low),
        ci_high=float(high),
        ci_level=level,
        ci_method=ci_method,
        exact_test=exact_test,
        exact_p=exact_p,
        wilcoxon_p=w_p,
        wilcoxon_method=w_method,
        wilcoxon_zero_method=WILCOXON_ZERO_METHOD,
        ttest_p=paired_t_p(a_arr, a_arr + diff),
        dz=effect_size_dz(diff),
        wins=wins,
        ties=n - wins - losses,
        losses=losses,
        separable=separable,
        verdict=_verdict(labels, n, mean_diff, low, high, level, exact_test, exact_p, wins, losses, separable,
                         higher_is_better)
        + (f"; note: {ci_note}" if ci_note else ""),
        ci_note=ci_note,
    )


def skew_note(diff: np.ndarray) -> str:
    """Why a mean interval may under-cover here, by Cochran's rule (n > 25 g1**2 for the mean to
    be near normal; g1 the sample skewness of the differences), or "" when the rule holds."""
    n = int(diff.shape[0])
    if n < 3 or np.ptp(diff) == 0.0:
        return ""
    g1 = float(scipy_stats.skew(diff))
    if not math.isfinite(g1) or n > 25 * g1 * g1:
        return ""
    return (f"the differences are skewed (g1 = {g1:+.2f}) for n = {n} (Cochran's rule wants n > 25 g1^2 = "
            f"{25 * g1 * g1:.0f}): a mean interval may under-cover (simulated at n = 50: 0.90 for lognormal-like "
            f"tails); the Wilcoxon signed-rank p beside it does not rest on the mean's normality")


def _verdict(
    labels: tuple[str, str],
    n: int,
    mean_diff: float,
    low: float,
    high: float,
    level: float,
    test: str,
    w_p: float,
    wins: int,
    losses: int,
    separable: bool,
    higher_is_better: bool = True,
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
            f"cannot separate: {ci_text} excludes 0 but {test} p={w_p:.3g} >= {1 - level:.3g} "
            f"(too few untied pairs; {counts})"
        )
    direction = "better" if (mean_diff > 0) == higher_is_better else "worse"
    return (
        f"{b_name} is {direction} than {a_name}: mean change {mean_diff:+.4g}, {ci_text}, "
        f"{test} p={w_p:.3g}; {counts}"
    )
