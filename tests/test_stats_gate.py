"""The regression gate's decision: planted regressions fire, noise does not, the type-I error
stays at alpha under the null (also when seeds are pooled), and bad input is refused."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from heldout.protocols.stats import StatsInputError, regression_check

ALPHA = 0.05


def test_a_planted_regression_fires_with_evidence():
    rng = np.random.default_rng(1)
    baseline = rng.binomial(1, 0.75, size=300).astype(float)
    current = np.where(rng.random(300) < 0.2, 0.0, baseline)  # 20% of answers break
    result = regression_check(baseline, current, min_effect=0.05)
    assert result.regressed
    assert result.p_value < ALPHA and result.mean_change < -0.05 and result.upper_bound < 0
    assert result.evidence.startswith("REGRESSION: mean change -")
    assert "exceeds min-effect 0.05" in result.evidence
    assert result.as_dict()["regressed"] is True


def test_noise_does_not_fire():
    rng = np.random.default_rng(2)
    baseline = rng.binomial(1, 0.75, size=300).astype(float)
    current = rng.binomial(1, 0.75, size=300).astype(float)
    result = regression_check(baseline, current)
    assert not result.regressed
    assert result.evidence.startswith("no regression:")


def test_an_improvement_is_not_a_regression():
    rng = np.random.default_rng(3)
    baseline = rng.binomial(1, 0.5, size=200).astype(float)
    result = regression_check(baseline, np.maximum(baseline, rng.binomial(1, 0.3, size=200)))
    assert not result.regressed and result.mean_change > 0 and result.p_value > 0.5


def test_a_significant_drop_within_min_effect_is_tolerated():
    rng = np.random.default_rng(4)
    baseline = rng.normal(0.7, 0.05, size=400)
    current = baseline - 0.01 + rng.normal(0.0, 0.01, size=400)
    strict = regression_check(baseline, current)
    tolerant = regression_check(baseline, current, min_effect=0.02)
    assert strict.regressed
    assert not tolerant.regressed and tolerant.p_value < ALPHA
    assert "does not exceed min-effect 0.02" in tolerant.evidence


def test_few_clusters_use_the_exact_sign_flip_distribution():
    three = regression_check([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    assert three.p_method == "exact sign-flip" and three.p_value == 1 / 8
    assert not three.regressed  # three broken examples cannot reach alpha = 0.05
    five = regression_check(np.ones(5), np.zeros(5))
    assert five.p_value == 1 / 32 and five.regressed


def test_one_pair_or_no_change_never_fires():
    one = regression_check([1.0], [0.0])
    assert one.p_value == 0.5 and not one.regressed
    unchanged = regression_check([0.2, 0.9, 0.5], [0.2, 0.9, 0.5])
    assert unchanged.p_value == 1.0 and unchanged.mean_change == 0.0 and not unchanged.regressed


def test_exact_p_equals_brute_force_enumeration():
    diff = np.array([-0.3, -0.1, 0.05, -0.2, 0.0, -0.4, 0.1])
    flipped = [np.dot(signs, diff) for signs in itertools.product([-1, 1], repeat=diff.size)]
    expected = np.mean(np.array(flipped) <= diff.sum() + 1e-12)
    assert regression_check(np.zeros(diff.size), diff).p_value == pytest.approx(expected)


def test_pooled_seeds_of_one_example_move_together_when_clustered():
    rng = np.random.default_rng(6)
    per_example = rng.normal(-0.02, 0.2, size=150)
    baseline = rng.random(150)
    # Three seeds that agree on every example: pooled they look like 450 independent pairs.
    pooled_base = np.tile(baseline, 3)
    pooled_cur = np.tile(baseline + per_example, 3)
    example_ids = [f"ex{i}" for i in range(150)] * 3
    single = regression_check(baseline, baseline + per_example)
    clustered = regression_check(pooled_base, pooled_cur, clusters=example_ids)
    naive = regression_check(pooled_base, pooled_cur)
    assert clustered.n_pairs == 450 and clustered.n_clusters == 150
    assert clustered.p_value == pytest.approx(single.p_value)
    assert clustered.upper_bound == pytest.approx(single.upper_bound)
    assert naive.p_value < clustered.p_value  # ignoring the clusters overstates the evidence


def test_strata_keep_task_weights_and_clusters_must_nest_in_them():
    base = [0.5, 0.6, 0.7, 0.2, 0.3, 0.4]
    cur = [0.4, 0.6, 0.6, 0.2, 0.3, 0.3]
    tasks = ["t1", "t1", "t1", "t2", "t2", "t2"]
    result = regression_check(base, cur, clusters=[("t1", 0), ("t1", 1), ("t1", 2), ("t2", 0), ("t2", 1), ("t2", 2)], strata=tasks)
    assert result.n_clusters == 6
    with pytest.raises(StatsInputError, match="every cluster must lie in a single stratum"):
        regression_check(base, cur, clusters=[0, 0, 1, 1, 2, 2], strata=[0, 0, 0, 1, 1, 1])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"baseline": [0.1, float("nan")], "current": [0.1, 0.2]}, r"baseline: 1 score\(s\) are NaN"),
        ({"baseline": [0.1, 0.2, 0.3], "current": [0.1, 0.2]}, "paired element by element"),
        ({"clusters": ["a"]}, r"clusters must give one label per paired score \(2\)"),
        ({"clusters": [[1], [2]]}, "labels must be hashable"),
        ({"min_effect": -0.1}, "min_effect must be a finite number >= 0"),
        ({"alpha": 1.5}, "alpha must be strictly between 0 and 1"),
    ],
)
def test_bad_gate_input_is_refused(kwargs, message):
    call = {"baseline": [0.5, 0.6], "current": [0.4, 0.6], **kwargs}
    with pytest.raises(StatsInputError, match=message):
        regression_check(call.pop("baseline"), call.pop("current"), **call)


def fire_rate(make_pair, trials, **kwargs):
    fired = 0
    for trial in range(trials):
        baseline, current, extra = make_pair(np.random.default_rng(1000 + trial))
        fired += regression_check(baseline, current, n_flips=2000, n_boot=200, seed=trial, **extra, **kwargs).regressed
    return fired / trials


def exchangeable_binary(rng):
    return rng.binomial(1, 0.6, size=80).astype(float), rng.binomial(1, 0.6, size=80).astype(float), {}


def exchangeable_skewed(rng):
    return rng.exponential(1.0, size=40), rng.exponential(1.0, size=40), {}


def seeds_sharing_examples(rng, clustered=True):
    # 40 examples x 3 seeds; each example's change is mostly shared by its seeds.
    shared = rng.normal(0.0, 1.0, size=40)
    diff = np.repeat(shared, 3) + rng.normal(0.0, 0.2, size=120)
    baseline = rng.random(120)
    return baseline, baseline + diff, {"clusters": np.repeat(np.arange(40), 3)} if clustered else {}


@pytest.mark.parametrize("make_pair", [exchangeable_binary, exchangeable_skewed, seeds_sharing_examples])
def test_type_one_error_is_at_most_alpha_under_the_null(make_pair):
    rate = fire_rate(make_pair, trials=400)
    assert rate <= ALPHA + 0.03


def test_pooling_seeds_without_clusters_inflates_false_alarms():
    rate = fire_rate(lambda rng: seeds_sharing_examples(rng, clustered=False), trials=400)
    assert rate > ALPHA + 0.05


def test_the_gate_has_power_against_a_real_drop():
    def dropped(rng):
        baseline = rng.binomial(1, 0.7, size=200).astype(float)
        return baseline, np.where(rng.random(200) < 0.12, 0.0, baseline), {}

    assert fire_rate(dropped, trials=100) >= 0.8
