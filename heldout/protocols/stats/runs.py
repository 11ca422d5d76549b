"""Comparisons whose unit of replication is the run (one optimizer run = one seed).

Every example a run scores shares that run's final candidate, so examples of one run are not
independent replicates of the method: the run is. A comparison of two methods therefore works on
**per-run scores** (a run's mean held-out score over the test set), and the test set is held
fixed: the question is "would these methods, run again on new seeds, differ on this test set?".

Two families of tests, chosen by the data, never by a library default:

* **t on per-run means** (a task with >= 2 held-out examples): a run's mean over many examples
  is close to normal, so a t test over runs holds alpha at 2-10 seeds. Seeds paired by id
  (``paired=True``): one-sample t on the per-pair differences ``d_s = mean_e(cur_s,e -
  base_s,e)``, ``S - 1`` degrees of freedom. Independent runs (``paired=False``): Welch's t with
  Satterthwaite degrees of freedom.
* **exact randomisation over runs** (a single-instance task: one score per run, whose law can be
  anything): paired, an exact sign-flip test on ``d_s`` (2**S patterns; the smallest one-sided p
  is 2**-S, so alpha = 0.05 needs >= 5 seed pairs); independent, an exact two-sample
  permutation test (C(S_b+S_c, S_c) splits; 3 + 3 runs reach p = 0.05).

Both give one-sided p-values for a shifted null ``change = theta0`` (used by the gate's
non-inferiority and equivalence tests) and confidence bounds by inverting those tests.

All functions here are pure and batched: inputs may carry leading batch axes (``(..., S)``),
so simulations of thousands of designs run as a few array operations through the same code the
gate uses.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats as scipy_stats

from ._checks import StatsInputError, as_scores, check_alpha

Side = Literal["less", "greater"]

EXACT_SIGN_FLIP_MAX = 16
"""Up to this many seed pairs the sign-flip test enumerates all 2**S sign patterns."""
EXACT_PERMUTATION_MAX = 200_000
"""Up to this many two-sample splits the permutation test enumerates them all."""
MONTE_CARLO_DRAWS = 20_000
"""Random patterns/splits drawn above the exact limits (p = (1 + hits) / (1 + draws))."""

TIE_RTOL = 1e-9
TIE_ATOL = 1e-12
"""Two scores tie when ``|a - b| <= TIE_ATOL + TIE_RTOL * max(|a|, |b|)``: differences below
that are float noise (a score recomputed in another order), never evidence."""


def tie_tolerance(*arrays: np.ndarray) -> float:
    """The absolute tie tolerance for scores on the scale of ``arrays``."""
    scale = max((float(np.max(np.abs(a))) for a in arrays if np.size(a)), default=0.0)
    return TIE_ATOL + TIE_RTOL * scale


def snap_ties(diff: np.ndarray, tol: float) -> np.ndarray:
    """``diff`` with every entry within ``tol`` of 0 set to exactly 0 (a tie)."""
    return np.where(np.abs(diff) <= tol, 0.0, diff)


def min_seeds_sign_flip(alpha: float) -> int:
    """Fewest seed pairs for which an exact one-sided sign-flip test can reach ``alpha``."""
    return max(1, math.ceil(math.log2(1.0 / check_alpha(alpha)) - 1e-12))


def min_seeds_permutation(alpha: float) -> int:
    """Fewest runs per arm (equal arms) for which an exact one-sided permutation test can reach
    ``alpha`` (the smallest p is 1 / C(2S, S))."""
    alpha = check_alpha(alpha)
    s = 1
    while 1.0 / math.comb(2 * s, s) > alpha:
        s += 1
    return s


# -- t over per-run means ------------------------------------------------------------------------
def t_moments(base: np.ndarray, cur: np.ndarray, *, paired: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(change, standard error, degrees of freedom)`` of mean(cur) - mean(base) over runs,
    batched over leading axes; the last axis holds the runs. ``df`` is NaN when the design has
    no spread to estimate (one run per arm), ``se`` is 0 when every run agrees."""
    base = np.asarray(base, dtype=np.float64)
    cur = np.asarray(cur, dtype=np.float64)
    if paired:
        d = cur - base
        s = d.shape[-1]
        change = d.mean(axis=-1)
        if s < 2:
            return change, np.full_like(change, np.nan), np.full_like(change, np.nan)
        se = d.std(axis=-1, ddof=1) / math.sqrt(s)
        return change, se, np.full_like(change, float(s - 1))
    sb, sc = base.shape[-1], cur.shape[-1]
    change = cur.mean(axis=-1) - base.mean(axis=-1)
    if min(sb, sc) < 2:
        return change, np.full_like(change, np.nan), np.full_like(change, np.nan)
    vb = base.var(axis=-1, ddof=1) / sb
    vc = cur.var(axis=-1, ddof=1) / sc
    se2 = vb + vc
    with np.errstate(invalid="ignore", divide="ignore"):
        df = se2**2 / (vb**2 / (sb - 1) + vc**2 / (sc - 1))
    # Both arms constant: no spread at all; keep the smallest honest df, it is not used.
    df = np.where(se2 > 0, df, float(min(sb, sc) - 1))
    return change, np.sqrt(se2), df


def t_shift_p(change: np.ndarray, se: np.ndarray, df: np.ndarray, theta0: float | np.ndarray, side: Side) -> np.ndarray:
    """One-sided p for H1 ``change < theta0`` (``side="less"``) or ``> theta0`` (``"greater"``).
    Zero spread is decided by the point (p = 0 or 1); an undefined df gives p = 1 (no test)."""
    change, se, df = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (change, se, df)))
    theta = np.broadcast_to(np.asarray(theta0, dtype=np.float64), change.shape)
    gap = change - theta
    tol = TIE_ATOL + TIE_RTOL * np.maximum(np.abs(change), np.abs(theta))
    with np.errstate(invalid="ignore", divide="ignore"):
        t = gap / se
        p = scipy_stats.t.cdf(t, df) if side == "less" else scipy_stats.t.sf(t, df)
    beyond = gap < -tol if side == "less" else gap > tol
    p = np.where(se <= tol, np.where(beyond, 0.0, 1.0), p)
    return np.where(np.isfinite(df), p, 1.0)


def t_bound(change: float, se: float, df: float, alpha: float, side: Side) -> float:
    """One-sided ``1 - alpha`` confidence bound: upper (``side="less"``) or lower."""
    if not math.isfinite(df):
        return math.inf if side == "less" else -math.inf
    q = float(scipy_stats.t.ppf(1.0 - alpha, df)) if se > 0 else 0.0
    return change + q * se if side == "less" else change - q * se


# -- exact randomisation over runs -----------------------------------------------------------------
@functools.lru_cache(maxsize=EXACT_SIGN_FLIP_MAX + 1)
def _all_sign_patterns(s: int) -> np.ndarray:
    patterns = np.array(list(itertools.product((1.0, -1.0), repeat=s)))
    patterns.flags.writeable = False  # shared by every call: nobody may change it
    return patterns


def _sign_patterns(s: int, rng: np.random.Generator | None) -> tuple[np.ndarray, bool]:
    if s <= EXACT_SIGN_FLIP_MAX:
        return _all_sign_patterns(s), True
    rng = rng or np.random.default_rng(0)
    draws = rng.choice((1.0, -1.0), size=(MONTE_CARLO_DRAWS, s))
    return np.vstack([np.ones((1, s)), draws]), False


def sign_flip_p(d: np.ndarray, theta0: float | np.ndarray, side: Side, *, seed: int = 0) -> np.ndarray:
    """One-sided sign-flip p for H1 ``mean(d) < theta0`` (or ``>``) over the last axis of ``d``
    (seed pairs), batched. Exact (every pattern, the observed one included) up to
    ``EXACT_SIGN_FLIP_MAX`` pairs. Valid when, under the null, ``d - theta0`` is symmetric about 0
    (exchangeable arms, shifted by ``theta0``)."""
    d = np.asarray(d, dtype=np.float64)
    x = d - np.asarray(theta0, dtype=np.float64)[..., None]
    tol = TIE_ATOL + TIE_RTOL * max(float(np.max(np.abs(d))) if d.size else 0.0, float(np.max(np.abs(theta0))))
    x = snap_ties(x, tol)
    patterns, _ = _sign_patterns(d.shape[-1], np.random.default_rng(seed))
    observed = x.sum(axis=-1)
    flipped = x @ patterns.T  # (..., patterns)
    slack = tol * d.shape[-1]
    if side == "less":
        return np.mean(flipped <= observed[..., None] + slack, axis=-1)
    return np.mean(flipped >= observed[..., None] - slack, axis=-1)


@functools.lru_cache(maxsize=32)
def _all_split_masks(sb: int, sc: int) -> np.ndarray:
    n = sb + sc
    masks = np.zeros((math.comb(n, sc), n))
    rows = np.repeat(np.arange(masks.shape[0]), sc)
    masks[rows, np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(n), sc)), dtype=np.intp,
                            count=rows.size)] = 1.0
    masks.flags.writeable = False  # shared by every call: nobody may change it
    return masks


@functools.lru_cache(maxsize=32)
def _kept_in_splits(sb: int, sc: int) -> np.ndarray:
    """How many of the ``cur`` runs each exact split keeps on the current side (row order of
    :func:`_all_split_masks`)."""
    kept = _all_split_masks(sb, sc)[:, sb:].sum(axis=1)
    kept.flags.writeable = False
    return kept


def _split_masks(sb: int, sc: int, rng: np.random.Generator | None) -> np.ndarray:
    """Rows of 0/1 over the pooled runs (base first): 1 marks a run assigned to ``cur``. The
    observed split is row 0 of the random ones (the exact ones hold it somewhere)."""
    n = sb + sc
    if math.comb(n, sc) <= EXACT_PERMUTATION_MAX:
        return _all_split_masks(sb, sc)
    observed = np.r_[np.zeros(sb), np.ones(sc)]
    rng = rng or np.random.default_rng(0)
    draws = np.argsort(rng.random((MONTE_CARLO_DRAWS, n)), axis=1) < sc
    return np.vstack([observed[None, :], draws.astype(np.float64)])


def _all_split_sums(pooled: np.ndarray, sc: int) -> np.ndarray:
    """The sum of ``pooled``'s runs (last axis) on the current side of every exact split, in the
    row order of :func:`_all_split_masks` (``itertools.combinations``), batched. Built from the
    last run back: the sums over runs ``i..`` taking ``k`` of them are run ``i`` plus those over
    ``i+1..`` taking ``k - 1``, then those over ``i+1..`` taking ``k``; about three additions per
    split instead of a product with the (splits x runs) mask matrix, which is memory-bound."""
    n = pooled.shape[-1]
    sums = {0: np.zeros(pooled.shape[:-1] + (1,))}  # over runs i.. (none yet), by how many are taken
    for i in range(n - 1, -1, -1):
        run = pooled[..., i:i + 1]
        sums = {k: np.concatenate([run + sums[k - 1]] + ([sums[k]] if k in sums else []), axis=-1)
                if k >= 1 else sums[0]
                for k in range(max(0, sc - i), min(sc, n - i) + 1)}
    return sums[sc]


SPLIT_SUMS_MIN_CELLS = 1 << 19
"""From this many mask cells (4 MiB: the mask matrix leaves the cache) one design's exact split
sums come from :func:`_all_split_sums`; a smaller design, or a batch of designs (one matrix
product for all), multiplies by the mask matrix."""


def _split_sums(pooled: np.ndarray, sb: int, sc: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
    """(the current side's sum for every split, how many ``cur`` runs each keeps there): every
    split exactly, or the random ones of :func:`_split_masks`."""
    splits = math.comb(sb + sc, sc)
    if splits <= EXACT_PERMUTATION_MAX:
        if pooled.ndim == 1 and splits * (sb + sc) >= SPLIT_SUMS_MIN_CELLS:
            return _all_split_sums(pooled, sc), _kept_in_splits(sb, sc)
        return pooled @ _all_split_masks(sb, sc).T, _kept_in_splits(sb, sc)
    masks = _split_masks(sb, sc, rng)
    return pooled @ masks.T, masks[:, sb:].sum(axis=1)


def permutation_p(base: np.ndarray, cur: np.ndarray, theta0: float | np.ndarray, side: Side, *, seed: int = 0) -> np.ndarray:
    """One-sided exact two-sample permutation p for H1 ``mean(cur) - mean(base) < theta0`` (or
    ``>``) over independent runs, batched over leading axes. ``cur`` is shifted by ``-theta0``
    first (a location-shift null); exact up to ``EXACT_PERMUTATION_MAX`` splits."""
    base = np.asarray(base, dtype=np.float64)
    cur = np.asarray(cur, dtype=np.float64)
    theta = np.asarray(theta0, dtype=np.float64)[..., None]
    sb, sc = base.shape[-1], cur.shape[-1]
    batch = np.broadcast_shapes(base.shape[:-1], cur.shape[:-1], theta.shape[:-1])
    pooled = np.concatenate([np.broadcast_to(base, batch + (sb,)), np.broadcast_to(cur - theta, batch + (sc,))],
                            axis=-1)
    tol = tie_tolerance(base, cur) + TIE_RTOL * float(np.max(np.abs(theta)))
    total = pooled.sum(axis=-1, keepdims=True)
    cur_sum, _ = _split_sums(pooled, sb, sc, np.random.default_rng(seed))
    stat = cur_sum / sc - (total - cur_sum) / sb
    observed = pooled[..., sb:].mean(axis=-1) - pooled[..., :sb].mean(axis=-1)
    slack = tol * (sb + sc)
    # a count over the splits, not a mean of booleans (the same number, without a float copy of them)
    if side == "less":
        return np.count_nonzero(stat <= observed[..., None] + slack, axis=-1) / stat.shape[-1]
    return np.count_nonzero(stat >= observed[..., None] - slack, axis=-1) / stat.shape[-1]


# -- one comparison --------------------------------------------------------------------------------
RunTest = Literal["paired t", "welch t", "exact sign-flip", "exact permutation"]


@dataclass(frozen=True)
class RunComparison:
    """``cur`` against ``base`` with the run as the unit of replication.

    ``change`` is mean(cur) - mean(base) over per-run scores; ``run_sd_base`` / ``run_sd_cur``
    are the run-to-run standard deviations of each arm's per-run score (ddof=1; NaN with one
    run) and ``run_sd_diff`` that of the paired differences (paired designs). ``low`` / ``high``
    are the two-sided ``level`` interval (t, or inverted exact test; infinite when the design
    cannot bound the change at all). ``min_seeds`` is the fewest runs per arm with which this
    test can reach ``1 - level`` / 2 one-sided at all (2 for t, 5 pairs for sign-flip at 0.05)."""

    test: str
    paired: bool
    n_base: int
    n_cur: int
    n_examples: int
    mean_base: float
    mean_cur: float
    change: float
    run_sd_base: float
    run_sd_cur: float
    run_sd_diff: float
    se: float
    df: float
    low: float
    high: float
    level: float
    min_seeds: int

    def p_value(self, base: np.ndarray, cur: np.ndarray, theta0: float, side: Side) -> float:
        return float(shift_p(self.test, base, cur, theta0, side, change=self.change, se=self.se, df=self.df))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_test(n_examples: int, paired: bool) -> RunTest:
    """The documented rule: an exact randomisation test over runs, whatever a run averages.

    A run's score is the score of the one candidate the run ended on, and which candidate that is
    has the law of the optimizer, not of the examples: often skewed (a rare big win) or two-valued
    (the trick was found or not), so a t test's normal premise is not theirs. The randomisation
    tests are exact for every law under the null that the two sides are exchangeable (paired: each
    seed's two runs could have come from either side; ``tests/test_seed_laws.py``), at the price
    of a floor on the seed count: a two-sided verdict
    at alpha 0.05 needs >= 6 seed pairs (sign-flip) or 4 + 4 runs (permutation). ``n_examples``
    no longer picks the test; it is kept for the callers that state it."""
    del n_examples
    return "exact sign-flip" if paired else "exact permutation"


def shift_p(test: str, base: np.ndarray, cur: np.ndarray, theta0: float, side: Side, *,
            change: float | None = None, se: float | None = None, df: float | None = None) -> float:
    """One-sided p of ``test`` for H1 ``change < theta0`` / ``> theta0`` on per-run scores."""
    if test in ("paired t", "welch t"):
        if change is None or se is None or df is None:
            change, se, df = (float(x) for x in t_moments(base, cur, paired=test == "paired t"))
        return float(t_shift_p(change, se, df, theta0, side))
    if test == "exact sign-flip":
        return float(sign_flip_p(cur - base, theta0, side))
    if test == "exact permutation":
        return float(permutation_p(base, cur, theta0, side))
    raise StatsInputError(f"unknown run-level test {test!r}")


def _linear_law(test: str, base: np.ndarray, cur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every sign pattern (or split) of ``test`` as a line in the shift ``theta``: against the
    shifted null it counts on the "greater" side iff ``h + theta * g >= -slack`` and on the "less"
    side iff ``h + theta * g <= slack``, with ``g >= 0`` (0 for the observed arrangement). A
    sign pattern e: ``h = mean(e d) - mean(d)``, ``g = 1 - mean(e)``; a split that sends ``k`` of
    the ``S_c`` current runs to the current side: ``g = 1 - k / S_c + (S_c - k) / S_b``."""
    rng = np.random.default_rng(0)
    if test == "exact sign-flip":
        d = cur - base
        patterns, _ = _sign_patterns(d.shape[-1], rng)
        return patterns @ d / d.size - d.mean(), 1.0 - patterns.mean(axis=1)
    sb, sc = base.shape[-1], cur.shape[-1]
    pooled = np.r_[base, cur]
    cur_sum, kept = _split_sums(pooled, sb, sc, rng)
    stat = cur_sum / sc - (pooled.sum() - cur_sum) / sb
    return stat - (cur.mean() - base.mean()), 1.0 - kept / sc + (sc - kept) / sb


def invert_linear_law(h: np.ndarray, g: np.ndarray, alpha: float, side: Side, slack: float) -> float:
    """The one-sided ``1 - alpha`` confidence bound of an exact test whose arrangements are lines
    ``h + theta g`` (see :func:`_linear_law`): the lower bound for ``side="greater"``, the upper
    for ``"less"``; infinite when no shift can be rejected. Each arrangement starts counting
    against a shift at one point, so the bound is an order statistic of those points: exact, and
    one enumeration instead of a bisection."""
    allowed = math.floor(alpha * h.size + 1e-9) - int(np.sum(g <= 1e-12))
    if allowed < 0:
        return -math.inf if side == "greater" else math.inf
    moving = g > 1e-12
    # one order statistic: a partial sort (np.partition) finds it without sorting every arrangement
    if side == "greater":  # counts for theta >= (-slack - h) / g
        points = (-slack - h[moving]) / g[moving]
        return float(np.partition(points, allowed)[allowed]) if allowed < points.size else math.inf
    points = (slack - h[moving]) / g[moving]  # counts for theta <= (slack - h) / g: the allowed-th largest
    k = points.size - 1 - allowed
    return float(np.partition(points, k)[k]) if k >= 0 else -math.inf


def compare_runs(
    base: Any,
    cur: Any,
    *,
    paired: bool,
    n_examples: int,
    alpha: float = 0.05,
    two_sided: bool = True,
) -> RunComparison:
    """Compare per-run scores ``cur`` against ``base`` (1-d, one entry per run; paired designs
    need equal lengths, row s of both from seed pair s). ``n_examples`` is how many held-out
    examples each per-run score averages (1 for a single-instance task): it picks the test by
    :func:`choose_test`. The interval is two-sided at ``1 - alpha`` (``two_sided=True``) or the
    pair of one-sided ``1 - alpha`` bounds (the gate's, i.e. a ``1 - 2 alpha`` interval)."""
    alpha = check_alpha(alpha)
    b = as_scores(base, "base runs")
    c = as_scores(cur, "current runs")
    if paired and b.shape != c.shape:
        raise StatsInputError(f"paired runs must pair one to one, got {b.shape[0]} baseline and {c.shape[0]} current runs")
    if int(n_examples) != n_examples or n_examples < 1:
        raise StatsInputError(f"n_examples must be an integer >= 1, got {n_examples!r}")
    test = choose_test(int(n_examples), paired)
    tail = alpha / 2 if two_sided else alpha
    change, se, df = (float(x) for x in t_moments(b, c, paired=paired))
    if test.endswith(" t"):
        low, high = t_bound(change, se, df, tail, "greater"), t_bound(change, se, df, tail, "less")
        min_seeds = 2
    else:
        h, g = _linear_law(test, b, c)  # enumerated once: both bounds read the same arrangements
        slack = 2 * tie_tolerance(b, c)
        low, high = invert_linear_law(h, g, tail, "greater", slack), invert_linear_law(h, g, tail, "less", slack)
        min_seeds = min_seeds_sign_flip(tail) if paired else min_seeds_permutation(tail)
    sd = lambda x: float(x.std(ddof=1)) if x.shape[0] > 1 else float("nan")  # noqa: E731
    return RunComparison(
        test=test, paired=paired, n_base=int(b.shape[0]), n_cur=int(c.shape[0]), n_examples=int(n_examples),
        mean_base=float(b.mean()), mean_cur=float(c.mean()), change=change,
        run_sd_base=sd(b), run_sd_cur=sd(c), run_sd_diff=sd(c - b) if paired else float("nan"),
        se=se, df=df, low=low, high=high, level=1.0 - 2 * tail, min_seeds=min_seeds,
    )


def seeds_needed(run_sd: float, margin: float, *, alpha: float, paired: bool, limit: int = 1000) -> int | None:
    """Fewest runs per arm for which a t bound at ``alpha`` (one-sided) would be tighter than
    ``margin`` at run-to-run SD ``run_sd`` (of per-run scores; of the paired differences when
    ``paired``). None when no number up to ``limit`` suffices (or ``margin`` is 0)."""
    if not (margin > 0) or not math.isfinite(run_sd):
        return None
    if run_sd == 0:
        return 2
    s = np.arange(2, limit + 1)  # every candidate count at once: one ppf call, not one per count
    df = s - 1 if paired else 2 * (s - 1)
    se = run_sd / np.sqrt(s) if paired else run_sd * np.sqrt(2.0 / s)
    enough = np.flatnonzero(scipy_stats.t.ppf(1 - alpha, df) * se < margin)
    return int(s[enough[0]]) if enough.size else None


@dataclass(frozen=True)
class RunVerdict:
    """A two-sided run-level comparison for a report: ``p`` (two-sided, twice the smaller
    one-sided p at 0), ``separable`` (the interval excludes 0 and p < 1 - level) and one
    sentence that names the winner or says why the data cannot separate the arms."""

    comparison: RunComparison
    p: float
    separable: bool
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return {"run_level": self.comparison.as_dict(), "run_level_p": self.p, "run_level_separable": self.separable,
                "run_level_verdict": self.verdict}


def run_verdict(base: Any, cur: Any, *, n_examples: int, paired: bool = False, alpha: float = 0.05,
                labels: tuple[str, str] = ("a", "b"), higher_is_better: bool = True) -> RunVerdict:
    """Two-sided comparison of per-run scores at ``alpha`` with the run as the unit (the
    report's comparison when both arms have >= 2 runs). ``higher_is_better`` (the metric's
    direction) decides only the sentence's "better"/"worse"."""
    comp = compare_runs(base, cur, paired=paired, n_examples=n_examples, alpha=alpha, two_sided=True)
    b, c = np.asarray(base, dtype=float), np.asarray(cur, dtype=float)
    p = min(1.0, 2.0 * min(comp.p_value(b, c, 0.0, "less"), comp.p_value(b, c, 0.0, "greater")))
    excludes = comp.low > 0.0 or comp.high < 0.0
    separable = bool(excludes and p < alpha)
    a_name, b_name = labels
    sd = (f"run-to-run SD {comp.run_sd_base:.3g} ({a_name}) / {comp.run_sd_cur:.3g} ({b_name})"
          if not paired else f"run-to-run SD {comp.run_sd_diff:.3g} (paired)")
    ci = f"{comp.level:.0%} CI [{comp.low:+.4g}, {comp.high:+.4g}]"
    facts = f"mean change {comp.change:+.4g} over {comp.n_base}/{comp.n_cur} runs, {ci}, {comp.test} p={p:.3g}, {sd}"
    if separable:
        return RunVerdict(comp, p, True, f"{b_name} is {'better' if (comp.change > 0) == higher_is_better else 'worse'} "
                          f"than {a_name}: {facts}")
    n = min(comp.n_base, comp.n_cur)
    unit = "seed pairs" if paired else "runs per arm"
    if n < comp.min_seeds:
        why = f"{comp.test} needs >= {comp.min_seeds} {unit} to reach alpha={alpha:g}, got {n}"
    else:
        spread = comp.run_sd_diff if paired else max(comp.run_sd_base, comp.run_sd_cur)
        k = seeds_needed(spread, abs(comp.change), alpha=alpha / 2, paired=paired)
        why = (f"need >= {max(k, n + 1)} {unit} at the observed run-to-run SD" if k is not None
               else "no feasible number of runs separates a change this small")
    return RunVerdict(comp, p, False, f"cannot separate: {why} ({facts})")
