"""How many paired examples (or seeds) an effect needs: the one-sample t power of the paired
differences (``statsmodels.stats.power.TTestPower``), with effect size Cohen's dz."""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import integrate
from scipy import stats as scipy_stats
from statsmodels.stats.power import TTestIndPower, TTestPower
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from ._checks import StatsInputError, check_alpha
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
    ``mde`` is the smallest true drop beyond ``min_effect`` that the gate's one-sided test calls
    a regression with probability ``power`` (and the smallest ``--min-effect`` at which an
    unchanged method passes with that probability). ``seeds_for_target`` / ``examples_for_target``
    answer the inverse question for ``target`` (None: unreachable within the search limit)."""

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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        arms = "seed pairs" if self.paired else "runs per arm"
        lines = [f"design: {self.seeds} {arms} x {self.n_examples} held-out example(s); {self.test}; one-sided "
                 f"alpha={self.alpha:g}, power {self.power:.0%}",
                 f"baseline score {self.p_base:.4g}; run-to-run SD of a run's mean {self.run_sd:.4g} "
                 f"({self.run_sd_source}; between-run part {self.between_sd:.4g})",
                 f"minimum detectable effect: {self.mde:.4g} (a drop of min-effect + {self.mde:.4g} is called a "
                 f"regression with probability {self.power:.0%}; an unchanged method passes only with "
                 f"--min-effect >= {self.mde:.4g})"]
        if self.target is not None:
            seeds = "unreachable" if self.seeds_for_target is None else f"{self.seeds_for_target} {arms}"
            examples = ("unreachable (run-to-run variance alone exceeds it)" if self.examples_for_target is None
                        else f"{self.examples_for_target} examples at {self.seeds} {arms}")
            lines.append(f"to detect {self.target:.4g}: {seeds} at {self.n_examples} examples; or {examples}")
        if self.headroom is not None:
            lines.append(f"headroom of the seed (ceiling minus its pilot val score): {self.headroom:.4g}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _mde(seeds: int, sd: float, alpha: float, power: float, paired: bool) -> float:
    if seeds < 2:
        return math.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if paired:
            effect = TTestPower().solve_power(effect_size=None, nobs=seeds, alpha=alpha, power=power, alternative="larger")
            return float(effect) * sd * math.sqrt(2.0)
        effect = TTestIndPower().solve_power(effect_size=None, nobs1=seeds, ratio=1.0, alpha=alpha, power=power,
                                             alternative="larger")
        return float(effect) * sd


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
    max_seeds: int = 200,
    max_examples: int = 100_000,
) -> GatePlan:
    """Plan the run-level comparison. ``run_sd`` is the SD of a run's mean held-out score
    (from a pilot of >= 2 runs scored on ``pilot_n_examples`` examples, or given); without it
    the binomial floor ``sqrt(p (1 - p) / n)`` is used and the plan says it is optimistic.
    ``paired`` assumes no correlation between runs of one seed pair (conservative). ``binary``:
    0/1 scores (the per-example part of the spread is at most binomial); otherwise ``run_sd`` is
    required and is used as it is (no example count can shrink it)."""
    alpha = check_alpha(alpha)
    power = _check_power(power)
    if int(seeds) != seeds or seeds < 1:
        raise StatsInputError(f"seeds must be an integer >= 1, got {seeds!r}")
    if int(n_examples) != n_examples or n_examples < 1:
        raise StatsInputError(f"n_examples must be an integer >= 1, got {n_examples!r}")
    if binary and not 0.0 <= p_base <= 1.0:
        raise StatsInputError(f"p_base must be a proportion in [0, 1] for 0/1 scores, got {p_base!r}")
    if not binary and run_sd is None:
        raise StatsInputError("scores that are not 0/1 need a run-to-run SD (give --run-sd or a --pilot of >= 2 runs)")
    notes: list[str] = []
    binomial = p_base * (1.0 - p_base) if binary else 0.0
    if run_sd is None:
        between, source = 0.0, "binomial floor, no run-to-run spread known: optimistic"
        notes.append("no pilot spread: give --run-sd or --pilot with >= 2 runs; real optimizers vary more")
    else:
        if not math.isfinite(run_sd) or run_sd < 0:
            raise StatsInputError(f"run_sd must be a finite number >= 0, got {run_sd!r}")
        pilot_n = pilot_n_examples or n_examples
        between = math.sqrt(max(run_sd**2 - binomial / pilot_n, 0.0))
        source = "from the pilot" if pilot_n_examples else "given"
    sd_at = lambda n: math.sqrt(between**2 + binomial / n)  # noqa: E731
    sd = sd_at(n_examples)
    if n_examples >= 2:
        test, min_seeds = ("paired t" if paired else "welch t"), 2
    else:
        test = "exact sign-flip" if paired else "exact permutation"
        min_seeds = min_seeds_sign_flip(alpha) if paired else min_seeds_permutation(alpha)
        notes.append(f"single-instance task: {test} over runs; needs >= {min_seeds} "
                     f"{'seed pairs' if paired else 'runs per arm'} to reach alpha at all; MDE uses the t approximation")
    mde = _mde(seeds, sd, alpha, power, paired) if seeds >= min_seeds else math.inf
    if seeds < min_seeds:
        notes.append(f"{seeds} run(s) per arm cannot reach alpha={alpha:g}: need >= {min_seeds}")
    seeds_for = examples_for = None
    if target is not None:
        if not (math.isfinite(target) and target > 0):
            raise StatsInputError(f"target must be a finite effect > 0, got {target!r}")
        seeds_for = next((s for s in range(max(2, min_seeds), max_seeds + 1) if _mde(s, sd, alpha, power, paired) <= target), None)
        if seeds >= min_seeds and binary:
            examples_for = next((n for n in _grow(n_examples, max_examples)
                                 if _mde(seeds, sd_at(n), alpha, power, paired) <= target), None)
            if examples_for is not None and examples_for < n_examples:
                examples_for = n_examples
    if headroom is not None and headroom < mde:
        notes.append(f"the seed leaves {headroom:.4g} of headroom, less than the MDE: an improvement of that size cannot show")
    return GatePlan(int(seeds), int(n_examples), paired, alpha, power, float(p_base), sd, between, source, test, min_seeds,
                    mde, target, seeds_for, examples_for, headroom, tuple(notes))


def _grow(start: int, limit: int):
    n = 1
    while n <= limit:
        yield n
        n = n + 1 if n < 64 else int(n * 1.1) + 1
