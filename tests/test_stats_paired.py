"""Paired per-example comparison: cross-checked against scipy on fixtures, edge cases defined."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats as scipy_stats

from heldout.protocols.stats import StatsInputError, mean_interval, paired_comparison
from heldout.protocols.stats import bootstrap as bootstrap_module
from heldout.protocols.stats.bootstrap import bca_acceleration


@pytest.fixture
def continuous_pair():
    rng = np.random.default_rng(20240601)
    a = rng.normal(0.55, 0.15, size=40)
    b = a + rng.gamma(2.0, 0.03, size=40) - 0.04  # skewed differences: BCa and percentile differ
    return a, b


@pytest.fixture
def binary_pair():
    rng = np.random.default_rng(7)
    a = rng.binomial(1, 0.55, size=60).astype(float)
    b = np.where(rng.random(60) < 0.8, a, 1.0 - a)  # mostly ties, like per-example accuracy
    return a, b


def scipy_paired_ci(a, b, method, seed):
    res = scipy_stats.bootstrap(
        (a, b),
        lambda x, y, axis: np.mean(y - x, axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=10_000,
        confidence_level=0.95,
        method=method,
        rng=np.random.default_rng(seed),
    )
    return res.confidence_interval.low, res.confidence_interval.high


@pytest.mark.parametrize("method, scipy_method", [("bca", "BCa"), ("percentile", "percentile")])
@pytest.mark.parametrize("data, lattice", [("continuous_pair", 0.0), ("binary_pair", 1 / 60)])
def test_bootstrap_ci_matches_scipy_within_monte_carlo_error(data, lattice, method, scipy_method, request):
    a, b = request.getfixturevalue(data)
    ours = paired_comparison(a, b, method=method, n_boot=10_000, seed=1)
    low, high = scipy_paired_ci(a, b, scipy_method, seed=2)
    diff = b - a
    standard_error = diff.std(ddof=1) / math.sqrt(diff.size)
    # Two independent 10k-resample quantiles differ by ~0.04 SE; 0.15 SE is ~4 sigma. Means of
    # 0/1 differences live on a 1/n lattice, so a quantile may land one step over.
    tolerance = 0.15 * standard_error + lattice
    assert ours.ci_method == method
    assert ours.ci_low == pytest.approx(low, abs=tolerance)
    assert ours.ci_high == pytest.approx(high, abs=tolerance)


def test_bca_shifts_the_interval_the_way_scipy_does_on_skewed_data(continuous_pair):
    a, b = continuous_pair
    bca = paired_comparison(a, b, method="bca", seed=3)
    pct = paired_comparison(a, b, method="percentile", seed=3)
    scipy_bca = scipy_paired_ci(a, b, "BCa", seed=4)
    scipy_pct = scipy_paired_ci(a, b, "percentile", seed=4)
    assert np.sign(bca.ci_high - pct.ci_high) == np.sign(scipy_bca[1] - scipy_pct[1])


def test_jackknife_acceleration_equals_the_explicit_leave_one_out_formula(continuous_pair):
    a, b = continuous_pair
    diff = b - a
    loo = np.array([np.delete(diff, i).mean() for i in range(diff.size)])
    u = loo.mean() - loo
    assert bca_acceleration(diff) == pytest.approx((u**3).sum() / (6 * (u**2).sum() ** 1.5), rel=1e-10)


def test_rank_and_t_tests_equal_scipy_and_zero_handling_is_pratt():
    rng = np.random.default_rng(11)
    diff = np.round(rng.normal(0.3, 1.0, size=60), 1)
    diff[:15] = 0.0
    a = rng.random(60)
    b = a + diff
    result = paired_comparison(a, b)
    pratt = scipy_stats.wilcoxon(b - a, zero_method="pratt").pvalue
    wilcox = scipy_stats.wilcoxon(b - a, zero_method="wilcox").pvalue
    assert result.wilcoxon_zero_method == "pratt"
    assert result.wilcoxon_p == pytest.approx(pratt, rel=1e-12)
    assert abs(pratt - wilcox) > 0.01  # the fixture really distinguishes the zero handling
    assert result.ttest_p == pytest.approx(scipy_stats.ttest_rel(b, a).pvalue, rel=1e-12)
    assert result.dz == pytest.approx((b - a).mean() / (b - a).std(ddof=1), rel=1e-12)


def test_summary_fields_and_win_tie_loss_are_counted_from_b(binary_pair):
    a, b = binary_pair
    result = paired_comparison(a, b, labels=("seed", "optimised"))
    assert result.n == 60
    assert (result.wins, result.ties, result.losses) == (int((b > a).sum()), int((b == a).sum()), int((b < a).sum()))
    assert result.mean_a == pytest.approx(a.mean())
    assert result.mean_b == pytest.approx(b.mean())
    assert result.mean_diff == pytest.approx(b.mean() - a.mean())
    assert result.ci_low <= result.mean_diff <= result.ci_high
    assert set(result.as_dict()) >= {"ci_low", "ci_high", "wilcoxon_p", "ttest_p", "dz", "verdict"}


def test_a_clear_improvement_is_separable_and_the_verdict_names_the_winner():
    rng = np.random.default_rng(5)
    a = rng.binomial(1, 0.4, size=300).astype(float)
    b = np.maximum(a, rng.binomial(1, 0.3, size=300))
    result = paired_comparison(a, b, labels=("seed", "gepa"))
    assert result.separable
    assert result.verdict.startswith("gepa is better than seed")
    worse = paired_comparison(b, a, labels=("seed", "gepa"))
    assert worse.separable and worse.verdict.startswith("gepa is worse than seed")


def test_a_ci_that_includes_zero_cannot_separate(binary_pair):
    a, _ = binary_pair
    rng = np.random.default_rng(9)
    b = np.where(rng.random(60) < 0.9, a, 1.0 - a)
    result = paired_comparison(a, b)
    assert result.ci_low <= 0.0 <= result.ci_high
    assert not result.separable
    assert result.verdict.startswith("cannot separate:") and "includes 0" in result.verdict


def test_all_ties_are_defined_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = paired_comparison([0.5, 1.0, 0.0, 1.0], [0.5, 1.0, 0.0, 1.0])
    assert (result.wins, result.ties, result.losses) == (0, 4, 0)
    assert result.wilcoxon_p == 1.0
    assert result.ttest_p == 1.0
    assert result.dz == 0.0
    assert (result.ci_low, result.ci_high, result.ci_method) == (0.0, 0.0, "degenerate")
    assert not result.separable
    assert result.verdict == "cannot separate: all 4 paired differences are 0"


def test_constant_nonzero_differences_are_defined_and_need_enough_pairs_to_separate():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        five = paired_comparison(np.zeros(5), np.full(5, 0.5))
        ten = paired_comparison(np.zeros(10), np.full(10, 0.5))
    assert five.dz == math.inf and five.ttest_p == 0.0
    assert (five.ci_low, five.ci_high, five.ci_method) == (0.5, 0.5, "degenerate")
    # A point CI from 5 wins is not enough: the exact signed-rank p is 2/32.
    assert five.exact_test == "Wilcoxon (exact sign-flip)"
    assert five.wilcoxon_p == pytest.approx(0.0625)
    assert not five.separable and "Wilcoxon (exact sign-flip) p=0.0625" in five.verdict
    assert ten.separable
    assert paired_comparison(np.full(3, 0.5), np.zeros(3)).dz == -math.inf


def test_zero_one_scores_use_exact_mcnemar_and_the_tango_score_interval():
    # 4 wins / 196 ties / 0 losses: a normal approximation says p = 0.0455; exact McNemar 0.125.
    a = np.r_[np.zeros(4), np.ones(100), np.zeros(96)]
    b = np.r_[np.ones(4), np.ones(100), np.zeros(96)]
    result = paired_comparison(a, b)
    assert (result.wins, result.ties, result.losses) == (4, 196, 0)
    assert result.exact_test == "exact McNemar" and result.exact_p == pytest.approx(0.125)
    assert result.exact_p == pytest.approx(scipy_stats.binomtest(4, 4, 0.5).pvalue)
    assert result.ci_method == "tango" and result.ci_low <= 0.02 <= result.ci_high
    assert not result.separable and result.verdict.startswith("cannot separate")


def test_a_single_example_cannot_separate_anything():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = paired_comparison([0.2], [0.7])
        binary = paired_comparison([0.0], [1.0])
    assert result.n == 1 and result.ci_method == "undefined"
    assert math.isnan(result.ci_low) and math.isnan(result.ci_high)
    assert math.isnan(result.ttest_p) and math.isnan(result.dz)
    assert not result.separable and not binary.separable
    assert result.verdict == binary.verdict == "cannot separate: only 1 paired example"


@pytest.mark.parametrize(
    "a, b, message",
    [
        ([0.1, float("nan"), 0.3], [0.1, 0.2, 0.3], r"a: 1 score\(s\) are NaN or infinite \(first at index \[1\]\)"),
        ([0.1, 0.2, 0.3], [0.1, 0.2, float("inf")], r"b: 1 score\(s\) are NaN or infinite"),
        ([0.1, 0.2, 0.3], [0.1, 0.2], r"paired element by element, got shapes \(3,\) and \(2,\)"),
        ([], [], r"needs at least 1 score"),
        ([[0.1, 0.2]], [[0.1, 0.2]], r"expected a 1-d array"),
        (["x", "y"], [0.1, 0.2], r"scores must be numbers"),
    ],
)
def test_bad_scores_are_refused_with_a_clear_error(a, b, message):
    with pytest.raises(StatsInputError, match=message):
        paired_comparison(a, b)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "studentized"}, "method must be one of 't', 'tango', 'bca', 'percentile'"),
        ({"ci": 1.0}, "ci must be a confidence level"),
        ({"n_boot": 10, "method": "bca"}, "n_boot must be an integer >= 100"),
        ({"method": "tango"}, "method 'tango' needs scores that are exactly 0 or 1"),
    ],
)
def test_bad_options_are_refused(kwargs, message):
    with pytest.raises(StatsInputError, match=message):
        paired_comparison([0.0, 1.0, 0.5], [1.0, 1.0, 0.0], **kwargs)


def test_seeded_and_independent_of_how_the_resample_matrix_is_chunked(continuous_pair, monkeypatch):
    a, b = continuous_pair
    first = paired_comparison(a, b, seed=42, method="bca")
    assert paired_comparison(a, b, seed=42, method="bca") == first
    assert paired_comparison(a, b, seed=43, method="bca").ci_low != first.ci_low
    monkeypatch.setattr(bootstrap_module, "CHUNK_CELLS", 97)  # many small chunks, one stream
    chunked = mean_interval(b - a, seed=42)
    assert (chunked.low, chunked.high) == (first.ci_low, first.ci_high)
