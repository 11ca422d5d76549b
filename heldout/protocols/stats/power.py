"""How many paired examples (or seeds) an effect needs: the one-sample t power of the paired
differences (``statsmodels.stats.power.TTestPower``), with effect size Cohen's dz."""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import integrate, optimize
from scipy import stats as scipy_stats
from scipy.special import ndtr
from statsmodels.stats.power import TTestIndPower, TTestPower
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from ._checks import StatsInputError, check_alpha
from .margin import DEFAULT_MARGIN, MAX_DROP_SHARE, Margin
from .runs import min_seeds_permutation, min_seeds_sign_flip

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


def integrated_t_power(dz: float, n: int, alpha: float, alternative: str) -> float:
    """Power of the one-sample t test by integrating over the chi-square law of the sample
    variance: ``P(T' > c) = E_V[Phi(dz sqrt(n) - c sqrt(V / df))]``, V ~ chi2(df). Finite where
    scipy's noncentral t is not (large noncentrality)."""
    df = n - 1
    nc = dz * math.sqrt(n)
    two = alternative == "two-sided"
    crit = float(scipy_stats.t.ppf(1 - (alpha / 2 if two else alpha), df))

    def tail(shift: float) -> float:
        integrand = lambda v: scipy_stats.chi2.pdf(v, df) * scipy_stats.norm.cdf(shift - crit * math.sqrt(v / df))  # noqa: E731
        return integrate.quad(integrand, 0, np.inf, limit=200)[0]

    return min(max(tail(nc) + (tail(-nc) if two else 0.0), 0.0), 1.0)


def t_power(dz: float, n: int, alpha: float, alternative: str) -> float:
    """Power of the one-sample t test on ``n`` pairs for effect ``dz`` (> 0): statsmodels'
    noncentral-t value, or :func:`integrated_t_power` where that is NaN."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        value = float(TTestPower().power(effect_size=dz, nobs=n, alpha=alpha, alternative=alternative))
    if math.isfinite(value):
        return min(max(value, 0.0), 1.0)
    return integrated_t_power(dz, n, alpha, alternative)


def required_sample_size(
    dz: float, *, alpha: float = 0.05, power: float = 0.8, alternative: Alternative = "two-sided"
) -> int:
    """Smallest number of pairs (examples, or seeds when the unit is a whole run) for a paired t
    test at ``alpha`` to detect an effect of size ``dz`` with probability ``power``. Never
    below 2: one pair has no spread to test against."""
    effect = _check_dz(dz)
    alpha = check_alpha(alpha)
    power = _check_power(power)
    solver = TTestPower()
    side = _alternative(alternative)

    def reaches(n: int) -> bool:
        return t_power(effect, n, alpha, side) >= power

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
    (always a number in [0, 1]; see :func:`t_power`)."""
    effect = _check_dz(dz)
    if int(n) != n or n < 2:
        raise StatsInputError(f"n must be an integer >= 2, got {n!r}")
    return t_power(effect, int(n), check_alpha(alpha), _alternative(alternative))


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


# -- planning a run-level comparison (the gate's and the report's design) ----------------------------
@dataclass(frozen=True)
class GatePlan:
    """What ``seeds`` runs per arm on ``n_examples`` held-out examples can detect.

    Model of a run's mean score: ``run_sd**2 = between**2 + p (1 - p) / n_examples`` (a run-level
    quality spread plus the per-example idiosyncrasy of the run's candidate, at most binomial).
    ``mde`` is the smallest true drop beyond the margin that the gate's one-sided test calls a
    regression with probability ``power``, at the strictest Holm step over ``tasks`` gated tasks
    (``alpha / tasks``). ``mde_pass`` is the smallest margin at which an unchanged method passes
    this task with probability ``power ** (1 / tasks)`` (non-inferiority at ``alpha``; the gate
    passes only when every task does, so ``tasks`` independent tasks all pass with probability
    ``power``). ``margin`` is the gate's ``--min-effect`` and ``margin_units`` its size in score
    units at ``p_base``. ``seeds_for_target`` / ``examples_for_target`` answer the inverse
    question for ``target`` (None: unreachable within the search limit)."""

    seeds: int
    n_examples: int
    paired: bool
    alpha: float
    power: float
    p_base: float
    run_sd: float
    between_sd: float
    run_sd_source: str
    test: str
    min_seeds: int
    mde: float
    target: float | None
    seeds_for_target: int | None
    examples_for_target: int | None
    headroom: float | None
    notes: tuple[str, ...]
    margin: str = DEFAULT_MARGIN
    margin_units: float = 0.0
    tasks: int = 1
    mde_pass: float = math.inf

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        arms = "seed pairs" if self.paired else "runs per arm"
        over = f" / {self.tasks} gated tasks (the strictest Holm step)" if self.tasks > 1 else ""
        lines = [f"design: {self.seeds} {arms} x {self.n_examples} held-out example(s); {self.test} (the gate's "
                 f"test); one-sided alpha={self.alpha:g}{over}, power {self.power:.0%}",
                 f"baseline score {self.p_base:.4g}; run-to-run SD of a run's mean {self.run_sd:.4g} "
                 f"({self.run_sd_source}; between-run part {self.between_sd:.4g})",
                 f"margin --min-effect {self.margin}: {self.margin_units:.4g} in score units at this baseline",
                 (f"regression: a true drop of margin + {self.mde:.4g} = {self.margin_units + self.mde:.4g} is called "
                  f"with probability {self.power:.0%}; smaller drops beyond the margin may be missed"
                  if math.isfinite(self.mde) else "regression: no drop can be called at this design (see the notes)")]
        if self.p_base > 0 and math.isfinite(self.mde) and self.margin_units + self.mde >= self.p_base:
            lines.append(f"WARNING: the smallest drop this design calls a regression ({self.margin_units + self.mde:.4g}) "
                         f"is {(self.margin_units + self.mde) / self.p_base:.3g}x the baseline score {self.p_base:.4g} "
                         f"itself: even a collapse to 0 may go uncalled; add seeds (or examples)")
        if self.margin_units >= self.mde_pass:
            lines.append(f"pass: an unchanged method passes this task with probability >= "
                         f"{self.power ** (1 / self.tasks):.0%} (the margin is >= {self.mde_pass:.4g})")
        else:
            lines.append(f"pass: an unchanged method passes with probability below {self.power ** (1 / self.tasks):.0%}"
                         f": the margin {self.margin_units:.4g} is under the {self.mde_pass:.4g} this design needs "
                         f"(more seeds, more examples, or a wider --min-effect); expect 'inconclusive'")
        if self.target is not None:
            seeds = "unreachable" if self.seeds_for_target is None else f"{self.seeds_for_target} {arms}"
            examples = ("unreachable (run-to-run variance alone exceeds it)" if self.examples_for_target is None
                        else f"{self.examples_for_target} examples at {self.seeds} {arms}")
            lines.append(f"to detect {self.target:.4g}: {seeds} at {self.n_examples} examples; or {examples}")
        if self.headroom is not None:
            lines.append(f"headroom of the seed (ceiling minus its pilot val score): {self.headroom:.4g}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


_WELCH_DRAWS = 100_000


@functools.lru_cache(maxsize=64)
def _welch_threshold(n: int, alpha: float) -> np.ndarray:
    """Per draw of the two sample variances (in units of the true one): the mean difference the
    one-sided Welch test needs to reject, ``crit(df_ws) * sqrt((s1^2 + s2^2) / n)``."""
    df = n - 1
    rng = np.random.default_rng(20261203)
    v1 = rng.chisquare(df, _WELCH_DRAWS) / df
    v2 = rng.chisquare(df, _WELCH_DRAWS) / df
    welch_df = (v1 + v2) ** 2 * df / (v1 ** 2 + v2 ** 2)
    return scipy_stats.t.ppf(1 - alpha, welch_df) * np.sqrt((v1 + v2) / n)


def welch_power(shift_sds: float, n: int, alpha: float) -> float:
    """Power of the one-sided Welch t test (the gate's test for independent runs) with ``n`` runs
    per arm of equal SD, at a true shift of ``shift_sds`` SDs of one run. Exact in the normal
    model up to Monte Carlo error (~0.002): the two sample variances are drawn from their
    chi-square law (fixed seed, so the answer is reproducible and smooth in the shift), and the
    mean difference, independent of them and ~ N(shift, 2 / n), is integrated in closed form."""
    if n < 2:
        return 0.0
    threshold = _welch_threshold(int(n), float(alpha))
    # the standard normal CDF itself (scipy.stats.norm.cdf's values, without its argument handling: half the time)
    return float(np.mean(ndtr((shift_sds - threshold) / math.sqrt(2.0 / n))))


def _mde(seeds: int, sd: float, alpha: float, power: float, paired: bool) -> float:
    if seeds < 2:
        return math.inf
    if sd == 0.0:
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if paired:
            effect = TTestPower().solve_power(effect_size=None, nobs=seeds, alpha=alpha, power=power, alternative="larger")
            return float(effect) * sd * math.sqrt(2.0)
    # independent runs: the gate runs Welch's test, whose power at small seed counts is below the
    # pooled t's (planning with the pooled t gave 73% at a planned 80%)
    high = 1.0
    while welch_power(high, seeds, alpha) < power:
        high *= 2.0
        if high > 1e6:
            return math.inf
    return float(optimize.brentq(lambda d: welch_power(d, seeds, alpha) - power, 0.0, high, xtol=1e-6)) * sd


def margin_in_units(margin: Margin, p_base: float, run_sd: float, ceiling: float | None) -> float:
    """The gate's margin in score units at an expected baseline ``p_base``, capped as the gate
    caps it (at most ``MAX_DROP_SHARE`` of a positive baseline score)."""
    if margin.kind == "absolute":
        units = margin.value
    elif margin.kind == "relative":
        units = margin.value * abs(p_base)
    elif margin.kind == "headroom":
        if ceiling is None or not math.isfinite(ceiling):
            raise StatsInputError("a headroom margin needs the task's score ceiling")
        units = margin.value * (ceiling - p_base)
    else:
        units = margin.value * run_sd
    return min(units, MAX_DROP_SHARE * p_base) if p_base > 0 else units


def plan_gate(
    *,
    seeds: int,
    n_examples: int,
    p_base: float,
    run_sd: float | None = None,
    pilot_n_examples: int | None = None,
    paired: bool = False,
    binary: bool = True,
    alpha: float = 0.05,
    power: float = 0.8,
    target: float | None = None,
    headroom: float | None = None,
    min_effect: "str | float | Margin" = DEFAULT_MARGIN,
    ceiling: float | None = None,
    tasks: int = 1,
    max_seeds: int = 200,
    max_examples: int = 100_000,
) -> GatePlan:
    """Plan the run-level comparison. ``run_sd`` is the SD of a run's mean held-out score
    (from a pilot of >= 2 runs scored on ``pilot_n_examples`` examples, or given); without it
    the binomial floor ``sqrt(p (1 - p) / n)`` is used and the plan says it is optimistic.
    ``paired`` assumes no correlation between runs of one seed pair (conservative). ``binary``:
    0/1 scores (the per-example part of the spread is at most binomial); otherwise ``run_sd`` is
    required and is used as it is (no example count can shrink it). ``min_effect`` is the gate's
    margin (its default; ``ceiling`` for a headroom margin) and ``tasks`` the number of tasks the
    gate will hold to it together (Holm over tasks for regressions, every task for a pass)."""
    alpha = check_alpha(alpha)
    margin = Margin.parse(min_effect)
    _check_plan_inputs(seeds=seeds, n_examples=n_examples, p_base=p_base, run_sd=run_sd, binary=binary, tasks=tasks)
    tasks = int(tasks)
    alpha_reg = alpha / tasks
    power = _check_power(power)
    notes: list[str] = []
    binomial = p_base * (1.0 - p_base) if binary else 0.0
    if run_sd is None:
        between, source = 0.0, "binomial floor, no run-to-run spread known: optimistic"
        notes.append("no pilot spread: give --run-sd or --pilot with >= 2 runs; real optimizers vary more")
    else:
        pilot_n = pilot_n_examples or n_examples
        between = math.sqrt(max(run_sd**2 - binomial / pilot_n, 0.0))
        source = "from the pilot" if pilot_n_examples else "given"
    sd_at = lambda n: math.sqrt(between**2 + binomial / n)  # noqa: E731
    sd = sd_at(n_examples)
    # the gate's tests are exact randomisation tests over runs (any law of run outcomes); the MDE
    # is their power under normal run outcomes, approximated by the t's
    test = "exact sign-flip" if paired else "exact permutation"
    min_seeds = min_seeds_sign_flip(alpha_reg) if paired else min_seeds_permutation(alpha_reg)
    notes.append(f"{test} over runs; needs >= {min_seeds} {'seed pairs' if paired else 'runs per arm'} to reach "
                 f"alpha={alpha_reg:g} at all; the MDE uses the t approximation of its power (normal run outcomes)")
    mde = _mde(seeds, sd, alpha_reg, power, paired) if seeds >= min_seeds else math.inf
    min_seeds_pass = min_seeds_sign_flip(alpha) if paired else min_seeds_permutation(alpha)
    mde_pass = _mde(seeds, sd, alpha, power ** (1.0 / tasks), paired) if seeds >= min_seeds_pass else math.inf
    if seeds < min_seeds:
        notes.append(f"{seeds} run(s) per arm cannot reach alpha={alpha_reg:g}: need >= {min_seeds}")
    margin_units = margin_in_units(margin, p_base, sd, ceiling)
    seeds_for = examples_for = None
    if target is not None:
        if not (math.isfinite(target) and target > 0):
            raise StatsInputError(f"target must be a finite effect > 0, got {target!r}")
        seeds_for = next((s for s in range(max(2, min_seeds), max_seeds + 1)
                          if _mde(s, sd, alpha_reg, power, paired) <= target), None)
        if seeds >= min_seeds and binary:
            examples_for = next((n for n in _grow(n_examples, max_examples)
                                 if _mde(seeds, sd_at(n), alpha_reg, power, paired) <= target), None)
            if examples_for is not None and examples_for < n_examples:
                examples_for = n_examples
    if headroom is not None and headroom < mde:
        notes.append(f"the seed leaves {headroom:.4g} of headroom, less than the MDE: an improvement of that size cannot show")
    return GatePlan(int(seeds), int(n_examples), paired, alpha, power, float(p_base), sd, between, source, test, min_seeds,
                    mde, target, seeds_for, examples_for, headroom, tuple(notes), margin=str(margin),
                    margin_units=margin_units, tasks=tasks, mde_pass=mde_pass)


def _check_plan_inputs(*, seeds: int, n_examples: int, p_base: float, run_sd: float | None, binary: bool,
                       tasks: int) -> None:
    """:func:`plan_gate`'s inputs, each refused with what it must be."""
    for name, value in (("tasks", tasks), ("seeds", seeds), ("n_examples", n_examples)):
        if int(value) != value or value < 1:
            raise StatsInputError(f"{name} must be an integer >= 1, got {value!r}")
    if binary and not 0.0 <= p_base <= 1.0:
        raise StatsInputError(f"p_base must be a proportion in [0, 1] for 0/1 scores, got {p_base!r}")
    if not binary and run_sd is None:
        raise StatsInputError("scores that are not 0/1 need a run-to-run SD (give --run-sd or a --pilot of >= 2 runs)")
    if run_sd is not None and (not math.isfinite(run_sd) or run_sd < 0):
        raise StatsInputError(f"run_sd must be a finite number >= 0, got {run_sd!r}")


def _grow(start: int, limit: int):
    n = 1
    while n <= limit:
        yield n
        n = n + 1 if n < 64 else int(n * 1.1) + 1
