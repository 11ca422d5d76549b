"""Calibration by simulation: the paired bootstrap CI covers the true mean change about 95% of
the time, for both methods and for continuous and 0/1 scores. Fixed seeds, so deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from heldout.protocols.stats import paired_comparison

TRIALS = 400


def continuous(rng):
    a = rng.normal(0.5, 0.2, size=40)
    return a, a + rng.normal(0.05, 0.3, size=40), 0.05


def accuracy(rng):
    # Per-example 0/1 accuracy; the new arm fixes 25% of failures and breaks 10% of successes.
    p_a, n = 0.6, 120
    a = rng.binomial(1, p_a, size=n).astype(float)
    fixed = (a == 0) & (rng.random(n) < 0.25)
    broken = (a == 1) & (rng.random(n) < 0.10)
    b = np.where(fixed, 1.0, np.where(broken, 0.0, a))
    return a, b, (1 - p_a) * 0.25 - p_a * 0.10


@pytest.mark.parametrize("method", ["bca", "percentile"])
@pytest.mark.parametrize("simulate", [continuous, accuracy])
def test_paired_bootstrap_ci_coverage_is_near_nominal(simulate, method):
    rng = np.random.default_rng(31337)
    covered = 0
    for trial in range(TRIALS):
        a, b, true_change = simulate(rng)
        result = paired_comparison(a, b, n_boot=2000, seed=trial, method=method)
        covered += result.ci_low <= true_change <= result.ci_high
    assert 0.92 <= covered / TRIALS <= 0.98


def test_separable_is_rarely_claimed_when_there_is_no_difference():
    rng = np.random.default_rng(99)
    claims = 0
    for trial in range(TRIALS):
        a = rng.binomial(1, 0.6, size=100).astype(float)
        b = rng.binomial(1, 0.6, size=100).astype(float)
        claims += paired_comparison(a, b, n_boot=1000, seed=trial).separable
    assert claims / TRIALS <= 0.05 + 0.03
