"""A paired comparison's paired t p, its differences' skewness and its Wilcoxon normal approximation
are scipy.stats' numbers, computed by scipy's own steps without its array-API and NaN-policy wrapper
(which cost half of a paired comparison's time): equal to scipy's to the last bit, on seeded samples
of seven laws (continuous, skewed, lattice, mostly unchanged, large scale, nearly constant) and sizes
from 3 to 119, with ties and zeros for the ranks."""

from __future__ import annotations

import numpy as np
from scipy import stats as scipy_stats

from heldout.protocols.stats.paired import _sample_skewness, paired_comparison, paired_t_p, wilcoxon_test

LAWS = (
    lambda rng, n: rng.normal(0.0, 1.0, n),
    lambda rng, n: rng.exponential(1.0, n),
    lambda rng, n: rng.integers(-3, 4, n) / 7,
    lambda rng, n: (rng.random(n) > 0.85) * rng.random(n),
    lambda rng, n: rng.lognormal(0.0, 1.0, n) * 1e4,
    lambda rng, n: rng.normal(0.6, 1e-6, n),
    lambda rng, n: rng.beta(0.2, 2.0, n) - 0.1,
)


def same(x: float, y: float) -> bool:
    return x == y or (np.isnan(x) and np.isnan(y))


def samples(count: int):
    rng = np.random.default_rng(2026)
    for k in range(count):
        n = int(rng.integers(3, 120))
        diff = LAWS[k % len(LAWS)](rng, n).astype(np.float64)
        if np.ptp(diff) > 0.0:  # a constant difference never reaches scipy (its own branch)
            yield rng.random(n), diff


def test_the_paired_t_p_is_scipys_ttest_rel_to_the_last_bit():
    pairs = [(paired_t_p(a, a + d), float(scipy_stats.ttest_rel(a + d, a).pvalue)) for a, d in samples(1400)]
    assert [pair for pair in pairs if not same(*pair)] == [] and len(pairs) > 1000


def test_the_skewness_is_scipys_skew_to_the_last_bit():
    pairs = [(_sample_skewness(d), float(scipy_stats.skew(d))) for _, d in samples(1400)]
    assert [pair for pair in pairs if not same(*pair)] == [] and len(pairs) > 1000


def test_the_wilcoxon_normal_approximation_is_scipys_to_the_last_bit():
    # above 25 non-zero differences the rank test is scipy's normal approximation (Pratt's zeros,
    # no continuity correction); the lattice and mostly-unchanged laws give ties and zeros
    pairs = [(wilcoxon_test(d), float(scipy_stats.wilcoxon(d, zero_method="pratt", correction=False,
                                                           method="approx").pvalue))
             for _, d in samples(1400) if np.count_nonzero(d) > 25]
    assert [(got, want) for (got, how), want in pairs if how != "normal approximation" or not same(got, want)] == []
    assert len(pairs) > 500 and any(np.count_nonzero(d == 0) for _, d in samples(1400) if np.count_nonzero(d) > 25)


def test_a_skewed_comparison_still_carries_its_note_and_its_t_p():
    # heavy lognormal differences at n = 50: the note fires (Cochran's rule) with scipy's g1
    d = np.random.default_rng(8).lognormal(0.0, 1.5, 50)
    result = paired_comparison(np.zeros(50), d, n_boot=200, seed=0)
    assert f"g1 = {float(scipy_stats.skew(d)):+.2f}" in result.ci_note
    assert result.ttest_p == float(scipy_stats.ttest_rel(d, np.zeros(50)).pvalue)
