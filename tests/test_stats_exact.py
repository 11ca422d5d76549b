"""Exact methods and their library counterparts: McNemar / sign test (statsmodels, scipy),
Tango's interval (the inverted score test, checked by brute force), the fixed Wilcoxon method
(scipy exact and exact permutation), finite power where scipy's noncentral t is NaN, and the
run-level Avg@k / Best@k / macro / IQM / probability-of-improvement intervals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.power import TTestPower

from heldout.protocols.stats import (
    StatsInputError,
    achieved_power,
    avg_at_k_interval,
    best_at_k,
    best_at_k_interval,
    iqm,
    iqm_interval,
    macro_mean_interval,
    paired_binary,
    paired_comparison,
    plan_gate,
    probability_of_improvement,
    probability_of_improvement_interval,
    tango_interval,
)
from heldout.protocols.stats.binary import tango_statistic
from heldout.protocols.stats.paired import wilcoxon_test
from heldout.protocols.stats.power import integrated_t_power


def test_exact_mcnemar_equals_the_binomial_test_on_discordant_pairs():
    rng = np.random.default_rng(1)
    for _ in range(20):
        a = rng.binomial(1, 0.6, size=40).astype(float)
        b = np.where(rng.random(40) < 0.3, 1 - a, a)
        result = paired_binary(a, b)
        wins, losses = int(((b == 1) & (a == 0)).sum()), int(((b == 0) & (a == 1)).sum())
        assert (result.b, result.c) == (wins, losses)
        if wins + losses:
            assert result.p_exact == pytest.approx(scipy_stats.binomtest(wins, wins + losses, 0.5).pvalue, rel=1e-12)
            assert result.p_greater == pytest.approx(
                scipy_stats.binomtest(wins, wins + losses, 0.5, alternative="greater").pvalue, rel=1e-12)


@pytest.mark.parametrize("b, c, n", [(4, 0, 200), (10, 3, 50), (0, 0, 20), (7, 7, 30), (20, 0, 20), (1, 12, 40)])
def test_tango_interval_is_the_set_of_differences_the_score_test_does_not_reject(b, c, n):
    low, high = tango_interval(b, c, n, 0.95)
    grid = np.linspace(-1 + 1e-9, 1 - 1e-9, 4001)
    kept = grid[[abs(tango_statistic(b, c, n, d)) <= scipy_stats.norm.ppf(0.975) for d in grid]]
    assert low == pytest.approx(max(kept.min(), -1.0), abs=1e-3)
    assert high == pytest.approx(min(kept.max(), 1.0), abs=1e-3)
    assert low <= (b - c) / n <= high


def test_zero_discordant_pairs_give_the_wilson_like_bound():
    # With no discordant pair the score interval is +-z^2 / (n + z^2).
    z2 = scipy_stats.norm.ppf(0.975) ** 2
    assert tango_interval(0, 0, 20) == pytest.approx((-z2 / (20 + z2), z2 / (20 + z2)), rel=1e-6)


def test_wilcoxon_is_exact_without_ties_and_equals_scipy_exact():
    rng = np.random.default_rng(2)
    for n in (5, 9, 17, 25):
        d = rng.normal(0.3, 1.0, size=n)
        p, method = wilcoxon_test(d)
        assert method == "exact sign-flip"
        assert p == pytest.approx(scipy_stats.wilcoxon(d, method="exact").pvalue, rel=1e-12)


def test_wilcoxon_with_ties_and_zeros_equals_scipy_exact_permutation():
    d = np.array([0.0, 0.0, 1.0, -2.0, 2.0, 3.0, 3.0, 4.0, -1.0, 5.0, 2.0])
    expected = scipy_stats.wilcoxon(d, zero_method="pratt",
                                    method=scipy_stats.PermutationMethod(n_resamples=np.inf)).pvalue
    assert wilcoxon_test(d) == (pytest.approx(expected, rel=1e-12), "exact sign-flip")


def test_wilcoxon_above_the_exact_limit_is_scipys_normal_approximation():
    rng = np.random.default_rng(3)
    d = np.round(rng.normal(0.2, 1.0, size=60), 1)
    p, method = wilcoxon_test(d)
    assert method == "normal approximation"
    assert p == pytest.approx(scipy_stats.wilcoxon(d, zero_method="pratt", correction=False, method="approx").pvalue,
                              rel=1e-12)


def test_float_noise_counts_as_a_tie():
    a = np.array([0.1, 0.2, 0.3, 0.7])
    b = a + np.array([1e-16, -3e-17, 0.0, 0.25])  # three recomputed-in-another-order ties
    result = paired_comparison(a, b)
    assert (result.wins, result.ties, result.losses) == (1, 3, 0)


def test_power_is_finite_everywhere_and_the_fallback_equals_statsmodels_where_both_exist():
    grid = [(dz, n) for dz in np.linspace(0.1, 40, 15) for n in (2, 3, 4, 6, 9, 12)]
    values = [achieved_power(dz, n) for dz, n in grid]
    assert all(0.0 <= v <= 1.0 for v in values)
    for dz, n in [(0.3, 5), (1.0, 3), (2.5, 2), (0.8, 12)]:
        for side in ("two-sided", "larger"):
            assert integrated_t_power(dz, n, 0.05, side) == pytest.approx(
                TTestPower().power(effect_size=dz, nobs=n, alpha=0.05, alternative=side), abs=1e-8)
    # power rises with the effect where scipy's noncentral t used to give NaN
    assert achieved_power(5, 2) < achieved_power(30, 2) <= 1.0


def test_plan_mde_shrinks_with_seeds_and_never_below_the_run_variance_floor():
    mdes = [plan_gate(seeds=s, n_examples=200, p_base=0.7, run_sd=0.04, pilot_n_examples=200).mde for s in (2, 3, 5, 10)]
    assert mdes == sorted(mdes, reverse=True)
    plan = plan_gate(seeds=3, n_examples=200, p_base=0.7, run_sd=0.04, pilot_n_examples=200, target=0.05)
    # more examples cannot shrink the between-run spread: a target below it needs seeds
    assert plan.seeds_for_target is not None and plan.seeds_for_target > 3
    assert plan.examples_for_target is None
    with pytest.raises(StatsInputError, match="need a run-to-run SD"):
        plan_gate(seeds=3, n_examples=1, p_base=5e-4, binary=False)


def test_avg_and_best_at_k_carry_their_uncertainty():
    runs = [0.61, 0.58, 0.70, 0.66, 0.55]
    avg = avg_at_k_interval(runs, 3)
    assert avg.estimate == pytest.approx(np.mean(runs))
    assert avg.se == pytest.approx(np.std(runs, ddof=1) / math.sqrt(5))
    best = best_at_k_interval(runs, 2)
    assert best.estimate == pytest.approx(best_at_k(runs, 2))
    loo = [best_at_k(np.delete(runs, i), 2) for i in range(5)]
    assert best.se == pytest.approx(math.sqrt(4 / 5 * np.sum((np.array(loo) - np.mean(loo)) ** 2)))
    assert best.low < best.estimate < best.high
    assert math.isnan(best_at_k_interval(runs, 5).se)  # Best@n of n runs has no replicate
    assert "needs >= 6 runs" in best_at_k_interval(runs, 5).method


def test_across_task_aggregates_and_their_small_run_fallbacks():
    rng = np.random.default_rng(4)
    a = {f"t{i}": rng.normal(0.5 + 0.05 * i, 0.05, 6) for i in range(6)}
    b = {f"t{i}": rng.normal(0.45 + 0.05 * i, 0.05, 6) for i in range(6)}
    boot = macro_mean_interval(a, b, n_boot=2000)
    assert boot.method.startswith("two-level bootstrap") and boot.low < boot.estimate < boot.high
    few = macro_mean_interval({k: v[:3] for k, v in a.items()}, {k: v[:3] for k, v in b.items()})
    assert few.method.startswith("t over runs, tasks fixed") and few.low < few.estimate < few.high
    flat = np.concatenate(list(a.values()))
    assert iqm(a) == pytest.approx(scipy_stats.trim_mean(flat, 0.25))
    assert iqm_interval(a, n_boot=300).low < iqm(a) < iqm_interval(a, n_boot=300).high
    assert math.isnan(iqm_interval({k: v[:3] for k, v in a.items()}).low)
    brute = np.mean([np.mean([(x > y) + 0.5 * (x == y) for x, y in itertools.product(a[t], b[t])]) for t in a])
    assert probability_of_improvement(a, b) == pytest.approx(brute)
    poi = probability_of_improvement_interval(a, b, n_boot=300)
    assert poi.low <= poi.estimate <= poi.high
