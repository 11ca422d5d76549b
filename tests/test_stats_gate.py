"""The regression gate's decision over runs x examples arrays: regression / pass / inconclusive,
with the run as the unit, exact tests for single-instance tasks, a margin that is tested (not
compared with a point estimate), Holm over tasks, and the batched path equal to the gate."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests

from heldout.protocols.stats import StatsInputError, TaskRuns, compare_runs, decide, holm_adjust, regression_check
from heldout.protocols.stats.gate import batched_pvalues

ALPHA = 0.05


def single(values):
    """Per-run scores of a single-instance task as a runs x 1 matrix."""
    return np.asarray(values, dtype=float)[:, None]


def test_an_88_percent_single_instance_drop_over_5_seeds_is_a_regression():
    rng = np.random.default_rng(0)
    base = 4.7e-3 * (1 + 0.02 * rng.standard_normal(5))
    cur = base * 0.12  # heilbronn-like: the area drops by 88 %
    result = regression_check({"heilbronn/triangle11": TaskRuns(single(base), single(cur), paired=True)})
    task = result.tasks[0]
    assert result.outcome == "regression" and result.exit_code == 1
    assert task.comparison.test == "exact sign-flip"
    assert task.p_regression == pytest.approx(1 / 32)
    assert result.evidence.startswith("REGRESSION: 1 regressed")


def test_three_seeds_of_a_single_instance_task_cannot_separate_and_say_how_many_are_needed():
    base, cur = single([4.7e-3, 4.6e-3, 4.8e-3]), single([5e-4, 6e-4, 5.5e-4])
    paired = regression_check({"t": TaskRuns(base, cur, paired=True)})
    assert paired.outcome == "inconclusive" and paired.exit_code == 2
    assert "needs >= 5 seed pairs" in paired.tasks[0].reason
    # Independent runs use the exact two-sample permutation test: 3 + 3 runs can reach 1/20.
    independent = regression_check({"t": TaskRuns(base, cur, paired=False)})
    assert independent.tasks[0].comparison.test == "exact permutation"
    assert independent.tasks[0].p_regression == pytest.approx(1 / 20)
    assert independent.outcome == "regression"


def test_runs_that_reproduce_exactly_pass_as_identical():
    rng = np.random.default_rng(1)
    scores = rng.binomial(1, 0.7, size=(3, 50)).astype(float)
    result = regression_check({"t": TaskRuns(scores, scores + 1e-15, paired=True)})
    assert result.outcome == "pass" and result.tasks[0].identical
    assert "identical" in result.tasks[0].reason


def test_noise_with_no_margin_is_inconclusive_never_no_regression():
    rng = np.random.default_rng(2)
    base = rng.binomial(1, 0.7, size=(3, 200)).astype(float)
    cur = rng.binomial(1, 0.7, size=(3, 200)).astype(float)
    result = regression_check({"t": TaskRuns(base, cur, paired=True)})
    assert result.outcome == "inconclusive"
    reason = result.tasks[0].reason
    assert reason.startswith("cannot separate:") and any(w in reason for w in ("need >=", "needs >=", "only a significant improvement"))
    assert "run-to-run SD" in result.evidence


def test_a_margin_the_data_can_bound_passes_with_non_inferiority_and_equivalence():
    rng = np.random.default_rng(3)
    quality = rng.uniform(0.3, 0.9, size=(1, 200))
    base = (rng.random((8, 200)) < quality).astype(float)
    cur = (rng.random((8, 200)) < quality).astype(float)
    result = regression_check({"t": TaskRuns(base, cur, paired=True)}, min_effect=0.05)
    task = result.tasks[0]
    assert result.outcome == "pass" and task.p_noninferior <= ALPHA
    assert "non-inferior" in task.reason and "equivalent within +-0.05" in task.reason
    assert task.comparison.low > -0.05


def test_a_significant_drop_inside_the_margin_is_not_a_regression():
    rng = np.random.default_rng(4)
    base = rng.normal(0.7, 0.01, size=(6, 100))
    cur = base - 0.01 + rng.normal(0.0, 0.001, size=(6, 100))
    strict = regression_check({"t": TaskRuns(base, cur, paired=True)})
    tolerant = regression_check({"t": TaskRuns(base, cur, paired=True)}, min_effect=0.02)
    assert strict.outcome == "regression"
    assert tolerant.outcome == "pass"


def test_holm_over_tasks_equals_statsmodels():
    rng = np.random.default_rng(5)
    p = rng.random((12, 6)) ** 3
    ours = holm_adjust(p)
    expected = np.array([multipletests(row, method="holm")[1] for row in p])
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-15)


def test_any_regressed_task_fails_the_gate_and_every_task_must_pass():
    p_reg = np.array([[0.001, 0.9], [0.2, 0.9], [0.2, 0.9]])
    p_non = np.array([[0.9, 0.01], [0.01, 0.01], [0.01, 0.2]])
    assert decide(p_reg, p_non, ALPHA).tolist() == [1, 0, 2]


def test_the_batched_simulation_path_decides_exactly_like_the_gate():
    rng = np.random.default_rng(6)
    for trial in range(24):
        paired = bool(trial % 2)
        n = 1 if trial % 4 < 2 else 30
        base = rng.normal(0.5, 0.05, size=(5, n))
        cur = base * 0 + rng.normal(0.5 - 0.04 * (trial % 3), 0.05, size=(5, n))
        gate = regression_check({"t": TaskRuns(base, cur, paired=paired)}, min_effect=0.01)
        p_reg, p_non = batched_pvalues(base.mean(axis=1), cur.mean(axis=1), n_examples=n, paired=paired, min_effect=0.01)
        assert gate.tasks[0].p_regression == pytest.approx(float(p_reg))
        assert gate.tasks[0].p_noninferior == pytest.approx(float(p_non))
        assert gate.exit_code == int(decide(np.array([p_reg]), np.array([p_non]), ALPHA))


def test_the_exact_interval_inverts_the_exact_test():
    base = np.array([1.0, 1.1, 0.9, 1.05, 0.95, 1.0])
    cur = base - np.array([0.3, 0.1, 0.2, 0.25, 0.15, 0.2])
    comp = compare_runs(base, cur, paired=True, n_examples=1, alpha=ALPHA, two_sided=False)
    assert comp.test == "exact sign-flip" and comp.high < 0
    # just above the upper bound the shifted test rejects, just below it does not
    assert comp.p_value(base, cur, comp.high + 1e-6, "less") <= ALPHA
    assert comp.p_value(base, cur, comp.high - 1e-3, "less") > ALPHA


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: TaskRuns(np.zeros((3, 4)), np.zeros((2, 4)), paired=True), "paired seeds need as many"),
        (lambda: TaskRuns(np.zeros((3, 4)), np.zeros((3, 5)), paired=False), "must score the same examples"),
        (lambda: TaskRuns(np.full((2, 2), np.nan), np.zeros((2, 2)), paired=True), "NaN"),
        (lambda: regression_check({}), "at least one task"),
        (lambda: regression_check({"t": TaskRuns(np.zeros((2, 2)), np.ones((2, 2)), paired=True)}, min_effect=-1),
         "min_effect must be a finite number >= 0"),
    ],
)
def test_bad_gate_input_is_refused(make, message):
    with pytest.raises(StatsInputError, match=message):
        make()
