"""Across seeds and across tasks: summaries, Avg@k/Best@k, two-level bootstrap, separates,
win counts, multiple-comparison corrections (equal to statsmodels), sample size (statsmodels
power, checked by simulation)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from heldout.protocols.stats import (
    StatsInputError,
    achieved_power,
    avg_at_k,
    best_at_k,
    correct_pvalues,
    macro_mean,
    minimum_detectable_dz,
    required_sample_size,
    separates,
    summarize_seeds,
    two_level_bootstrap,
    win_counts,
)

# --- across seeds -----------------------------------------------------------------------------


def test_seed_summary_is_mean_and_sample_std():
    summary = summarize_seeds([0.70, 0.74, 0.69])
    assert summary.k == 3
    assert summary.mean == pytest.approx(np.mean([0.70, 0.74, 0.69]))
    assert summary.std == pytest.approx(np.std([0.70, 0.74, 0.69], ddof=1))
    assert (summary.min, summary.max) == (0.69, 0.74)
    assert summary.format() == "0.710 ± 0.026"


def test_one_seed_has_no_spread():
    summary = summarize_seeds([0.5])
    assert math.isnan(summary.std)
    assert summary.format(2) == "0.50 ± n/a"


def test_best_at_k_is_the_mean_best_over_all_k_subsets_of_the_runs():
    runs = [0.61, 0.58, 0.70, 0.66, 0.55]
    for k in range(1, 6):
        brute = np.mean([max(subset) for subset in itertools.combinations(runs, k)])
        assert best_at_k(runs, k) == pytest.approx(brute, rel=1e-12)
    assert best_at_k(runs) == 0.70
    assert best_at_k(runs, 1) == pytest.approx(np.mean(runs))
    assert avg_at_k(runs, 3) == pytest.approx(np.mean(runs))


@pytest.mark.parametrize("k", [0, 6, 2.5])
def test_k_beyond_the_available_runs_is_refused(k):
    with pytest.raises(StatsInputError, match=r"k must be an integer in \[1, 5\]"):
        best_at_k([0.1, 0.2, 0.3, 0.4, 0.5], k)
    with pytest.raises(StatsInputError, match=r"k must be an integer in \[1, 5\]"):
        avg_at_k([0.1, 0.2, 0.3, 0.4, 0.5], k)


def test_separates_only_when_seed_ranges_do_not_overlap():
    assert separates([0.60, 0.62, 0.61], [0.70, 0.65, 0.72])
    assert separates([0.70, 0.65, 0.72], [0.60, 0.62, 0.61])
    assert not separates([0.60, 0.66, 0.61], [0.70, 0.65, 0.72])  # 0.66 > 0.65: overlap
    assert not separates([0.60, 0.65], [0.65, 0.70])  # touching ranges are not a win
    assert not separates([0.10], [0.90])  # one run has no range
    assert separates([0.10], [0.90], min_seeds=1)


def crossed_scores(rng, n_seeds, n_examples, true_diff):
    """Per-example differences for seeds x examples on one shared test set: a seed effect, an
    example effect every seed shares (hard examples are hard for all seeds), and noise."""
    seed_effect = rng.normal(0.0, 0.05, size=(n_seeds, 1))
    example_effect = rng.normal(0.0, 0.3, size=(1, n_examples))
    noise = rng.normal(0.0, 0.3, size=(n_seeds, n_examples))
    baseline = rng.random((n_seeds, n_examples))
    return baseline, baseline + true_diff + seed_effect + example_effect + noise


def test_two_level_bootstrap_covers_the_true_difference_on_a_shared_test_set():
    rng = np.random.default_rng(2024)
    trials, covered_shared, covered_nested = 300, 0, 0
    for trial in range(trials):
        a, b = crossed_scores(rng, n_seeds=8, n_examples=40, true_diff=0.1)
        shared = two_level_bootstrap(a, b, n_boot=1000, seed=trial)
        nested = two_level_bootstrap(a, b, n_boot=1000, seed=trial, examples="nested")
        covered_shared += shared.ci_low <= 0.1 <= shared.ci_high
        covered_nested += nested.ci_low <= 0.1 <= nested.ci_high
    # Moving all seeds with one example draw keeps nominal coverage; a fresh draw per seed
    # ignores that examples are shared and is far too narrow.
    assert 0.92 <= covered_shared / trials <= 0.99
    assert covered_nested / trials < 0.85


def test_two_level_bootstrap_result_and_inputs():
    rng = np.random.default_rng(3)
    a, b = crossed_scores(rng, n_seeds=3, n_examples=50, true_diff=0.3)
    result = two_level_bootstrap(a, b, seed=1)
    assert (result.n_seeds, result.n_examples, result.examples) == (3, 50, "shared")
    assert result.mean_diff == pytest.approx((b - a).mean())
    assert result.ci_low < result.mean_diff < result.ci_high
    assert two_level_bootstrap(a, b, seed=1) == result
    assert result.as_dict()["separable"] is result.separable
    with pytest.raises(StatsInputError, match="at least 2 seeds"):
        two_level_bootstrap(a[:1], b[:1])
    with pytest.raises(StatsInputError, match="paired element by element"):
        two_level_bootstrap(a, b[:, :49])
    with pytest.raises(StatsInputError, match="expected a 2-d array"):
        two_level_bootstrap(a[0], b[0])
    with pytest.raises(StatsInputError, match="examples must be 'shared' or 'nested'"):
        two_level_bootstrap(a, b, examples="independent")


# --- across tasks -----------------------------------------------------------------------------


def test_macro_mean_weights_every_task_once():
    assert macro_mean({"bbh/word_sorting": 0.9, "gsm_hard": 0.3, "mbpp_plus": 0.6}) == pytest.approx(0.6)
    with pytest.raises(StatsInputError, match="at least one task"):
        macro_mean({})
    with pytest.raises(StatsInputError, match="NaN or infinite"):
        macro_mean({"a": 0.5, "b": float("nan")})


TABLE = {
    "seed": {"t1": [0.50, 0.50, 0.50], "t2": [0.30, 0.30, 0.30], "t3": [0.70, 0.70, 0.70]},
    "gepa": {"t1": [0.60, 0.62, 0.58], "t2": [0.28, 0.35, 0.30], "t3": [0.70, 0.70, 0.70]},
    "sepo": {"t1": [0.45, 0.48, 0.44], "t2": [0.40, 0.42, 0.41], "t3": [0.69, 0.72, 0.71]},
}


def test_win_counts_per_baseline_with_and_without_separation():
    counts = {(c.method, c.baseline): c for c in win_counts(TABLE, baselines=["seed"])}
    assert set(counts) == {("gepa", "seed"), ("sepo", "seed")}
    gepa = counts["gepa", "seed"]
    # t1 higher on every run, t2 higher mean, t3 identical: wins by means. With 3 runs a side the
    # exact permutation's smallest two-sided p is 2 / C(6, 3) = 0.1, so nothing is separated (a
    # Welch t said p 0.013 for t1, assuming normal run outcomes).
    assert (gepa.wins, gepa.ties, gepa.losses) == (2, 1, 0)
    assert (gepa.separated_wins, gepa.separated_losses) == (0, 0)
    sepo = counts["sepo", "seed"]
    assert (sepo.wins, sepo.ties, sepo.losses) == (2, 0, 1)
    # t1's drop has disjoint seed ranges, which the old rule counted as a separated loss: not separated
    assert (sepo.separated_wins, sepo.separated_losses) == (0, 0)
    five = {m: {t: v + v[:2] for t, v in tasks.items()} for m, tasks in TABLE.items()}  # 5 runs a side
    assert {(c.method, c.separated_wins) for c in win_counts(five, baselines=["seed"])} == {("gepa", 1), ("sepo", 1)}
    both = win_counts(TABLE, baselines=["seed", "gepa"])
    assert len(both) == 4 and {c.baseline for c in both} == {"seed", "gepa"}


def test_win_counts_refuses_ragged_tables_and_unknown_baselines():
    ragged = {**TABLE, "opro": {"t1": [0.5, 0.5], "t2": [0.3, 0.3]}}
    with pytest.raises(StatsInputError, match=r"'opro' does not cover the same tasks.*t3"):
        win_counts(ragged, baselines=["seed"])
    with pytest.raises(StatsInputError, match=r"baseline\(s\) \['miprov2'\] not in the table"):
        win_counts(TABLE, baselines=["miprov2"])


@pytest.mark.parametrize("method", ["holm", "fdr_bh", "bonferroni", "fdr_by"])
def test_corrections_equal_statsmodels_multipletests(method):
    raw = [0.001, 0.012, 0.019, 0.04, 0.2, 0.6]
    reject, adjusted, _, _ = multipletests(raw, alpha=0.05, method=method)
    result = correct_pvalues(dict(zip("abcdef", raw)), method=method)
    assert result.method == method and result.names == tuple("abcdef")
    assert result.p_adjusted == pytest.approx(adjusted, rel=1e-12)
    assert result.reject == tuple(bool(r) for r in reject)
    assert result.as_dict()["tests"][0] == {"name": "a", "p_raw": 0.001, "p_adjusted": result.p_adjusted[0], "reject": True}


def test_holm_and_bh_really_differ_on_this_fixture():
    raw = [0.001, 0.012, 0.019, 0.04, 0.2, 0.6]
    assert sum(correct_pvalues(raw, method="holm").reject) < sum(correct_pvalues(raw, method="fdr_bh").reject)


def test_correction_method_must_be_named_and_p_values_valid():
    with pytest.raises(TypeError):
        correct_pvalues([0.01, 0.2])  # no default method on purpose
    with pytest.raises(StatsInputError, match="method must be one of"):
        correct_pvalues([0.01, 0.2], method="hochberg")
    with pytest.raises(StatsInputError, match=r"must lie in \[0, 1\]"):
        correct_pvalues([0.01, 1.2], method="holm")
    with pytest.raises(StatsInputError, match="NaN or infinite"):
        correct_pvalues([0.01, float("nan")], method="fdr_bh")


# --- sample size --------------------------------------------------------------------------------


@pytest.mark.parametrize("dz", [0.2, 0.5, -0.8])
@pytest.mark.parametrize("alternative, sm_alternative", [("two-sided", "two-sided"), ("one-sided", "larger")])
def test_sample_size_is_the_smallest_n_reaching_the_power(dz, alternative, sm_alternative):
    n = required_sample_size(dz, alpha=0.05, power=0.8, alternative=alternative)
    solved = TTestPower().solve_power(effect_size=abs(dz), alpha=0.05, power=0.8, alternative=sm_alternative)
    assert n == math.ceil(solved)
    assert achieved_power(dz, n, alternative=alternative) >= 0.8 > achieved_power(dz, n - 1, alternative=alternative)


def test_sample_size_delivers_its_power_in_simulation():
    n = required_sample_size(0.5, alpha=0.05, power=0.8)
    assert n == 34
    rng = np.random.default_rng(8)
    diffs = rng.normal(0.5, 1.0, size=(4000, n))
    rejected = scipy_stats.ttest_1samp(diffs, 0.0, axis=1).pvalue < 0.05
    assert 0.78 <= rejected.mean() <= 0.84


def test_huge_effects_still_need_two_pairs_and_detectable_effect_round_trips():
    for huge in (3.0, 8.0, 20.0, 100.0):
        n = required_sample_size(huge)
        assert achieved_power(huge, n) >= 0.8
        assert n == 2 or not achieved_power(huge, n - 1) >= 0.8  # NaN at n=2 counts as not reached
    assert required_sample_size(100.0) == 2
    dz = minimum_detectable_dz(200)
    assert achieved_power(dz, 200) == pytest.approx(0.8, abs=1e-4)
    assert 0.19 < dz < 0.21


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: required_sample_size(0.0), "finite, non-zero effect size"),
        (lambda: required_sample_size(float("nan")), "finite, non-zero effect size"),
        (lambda: required_sample_size(0.5, power=1.0), "power must be strictly between"),
        (lambda: required_sample_size(0.5, alpha=0.0), "alpha must be strictly between"),
        (lambda: required_sample_size(0.5, alternative="less"), "alternative must be"),
        (lambda: achieved_power(0.5, 1), "n must be an integer >= 2"),
        (lambda: minimum_detectable_dz(1.5), "n must be an integer >= 2"),
    ],
)
def test_power_inputs_are_checked(call, message):
    with pytest.raises(StatsInputError, match=message):
        call()
