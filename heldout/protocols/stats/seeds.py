"""Across seeds: mean +/- std, Avg@k, Best@k, the two-level bootstrap, and ``separates``.

A seed is one whole optimizer run; its score is the run's held-out score (one number), or,
for the two-level bootstrap, its per-example held-out scores (one row).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats as scipy_stats

from ._checks import StatsInputError, as_paired, as_scores, check_level, check_n_boot
from .bootstrap import CHUNK_CELLS, percentile_interval, resample_counts

ExampleResampling = Literal["shared", "nested"]


@dataclass(frozen=True)
class SeedSummary:
    """Per-seed scores of one method on one task, the cell of a task x method table.
    ``std`` uses ddof=1 and is NaN for a single seed (one run says nothing about spread)."""

    k: int
    mean: float
    std: float
    min: float
    max: float

    def format(self, digits: int = 3) -> str:
        """``"0.712 ± 0.015"`` (``"0.712 ± n/a"`` for one seed)."""
        spread = "n/a" if math.isnan(self.std) else f"{self.std:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {spread}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize_seeds(seed_scores: Any) -> SeedSummary:
    scores = as_scores(seed_scores, "seed_scores")
    return SeedSummary(
        k=int(scores.shape[0]),
        mean=float(scores.mean()),
        std=float(scores.std(ddof=1)) if scores.shape[0] > 1 else float("nan"),
        min=float(scores.min()),
        max=float(scores.max()),
    )


def _check_k(k: int | None, n: int) -> int:
    k = n if k is None else k
    if int(k) != k or not 1 <= k <= n:
        raise StatsInputError(f"k must be an integer in [1, {n}] (the number of seeds available), got {k!r}")
    return int(k)


def avg_at_k(seed_scores: Any, k: int | None = None) -> float:
    """Expected mean score of ``k`` runs drawn from the ``n`` available. The sample mean of all
    ``n`` is unbiased for every ``k <= n``, so ``k`` only checks that enough runs exist."""
    scores = as_scores(seed_scores, "seed_scores")
    _check_k(k, scores.shape[0])
    return float(scores.mean())


def best_at_k(seed_scores: Any, k: int | None = None) -> float:
    """Expected best score of ``k`` runs, estimated without bias from ``n >= k`` runs: the mean
    of the maximum over all ``C(n, k)`` subsets, i.e. sorted scores weighted by
    ``C(i-1, k-1) / C(n, k)`` (the chance that the i-th smallest is a subset's maximum). With
    ``k = n`` (the default) it is simply the best run."""
    scores = np.sort(as_scores(seed_scores, "seed_scores"))
    n = scores.shape[0]
    k = _check_k(k, n)
    total = math.comb(n, k)
    weights = np.array([math.comb(i - 1, k - 1) / total for i in range(1, n + 1)])
    return float(weights @ scores)


def separates(a_seed_scores: Any, b_seed_scores: Any, *, min_seeds: int = 2) -> bool:
    """True iff the two methods' seed ranges do not overlap (every seed of one beats every seed
    of the other). Refuses (False) when the ranges touch or overlap, or when either side has
    fewer than ``min_seeds`` seeds: a single run has no range to compare."""
    a = as_scores(a_seed_scores, "a_seed_scores")
    b = as_scores(b_seed_scores, "b_seed_scores")
    if min(a.shape[0], b.shape[0]) < min_seeds:
        return False
    return bool(a.min() > b.max() or b.min() > a.max())


@dataclass(frozen=True)
class TwoLevelInterval:
    """Percentile bootstrap interval for the mean of ``b - a`` over seeds x examples."""

    n_seeds: int
    n_examples: int
    mean_diff: float
    ci_low: float
    ci_high: float
    ci_level: float
    examples: str

    @property
    def separable(self) -> bool:
        return bool(self.ci_low > 0.0 or self.ci_high < 0.0)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "separable": self.separable}


def two_level_bootstrap(
    a: Any,
    b: Any,
    *,
    n_boot: int = 10_000,
    ci: float = 0.95,
    seed: int = 0,
    examples: ExampleResampling = "shared",
) -> TwoLevelInterval:
    """Interval for the mean difference between two methods paired by seed and example;
    ``a`` and ``b`` have shape (seeds, examples) and row s of both comes from seed s.

    Each resample draws seeds with replacement, then examples with replacement:

    * ``"shared"`` (default): one example draw per resample, used for every drawn seed. Right
      when every seed is scored on the same held-out examples (heldout's case): seeds and
      examples are crossed, and an example that is hard for one seed is hard for all, so the
      example draw must move all seeds together (the "pigeonhole" bootstrap, slightly
      conservative).
    * ``"nested"``: a fresh example draw inside each drawn seed. Right when each seed has its
      own examples; on a shared test set it understates the example-level variance.

    Needs at least 2 seeds: with one, use :func:`paired_comparison`."""
    a_arr, b_arr = as_paired(a, b, ("a", "b"), ndim=2)
    level = check_level(ci)
    n_boot = check_n_boot(n_boot)
    if examples not in ("shared", "nested"):
        raise StatsInputError(f"examples must be 'shared' or 'nested', got {examples!r}")
    n_seeds, n_examples = a_arr.shape
    if n_seeds < 2:
        raise StatsInputError(
            f"two_level_bootstrap needs at least 2 seeds, got {n_seeds}; use paired_comparison for one seed"
        )
    diff = b_arr - a_arr
    rng = np.random.default_rng(seed)
    boot = _shared_means(diff, n_boot, rng) if examples == "shared" else _nested_means(diff, n_boot, rng)
    low, high = percentile_interval(boot, level)
    return TwoLevelInterval(n_seeds, n_examples, float(diff.mean()), low, high, level, examples)


def _shared_means(diff: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    # A resample's mean is (seed counts) @ diff @ (example counts) / (S * N): draw counts
    # replace a 3-d index array, so memory stays O(n_boot * (S + N)).
    n_seeds, n_examples = diff.shape
    rows = max(1, CHUNK_CELLS // max(n_seeds, n_examples))
    out = np.empty(n_boot)
    for start in range(0, n_boot, rows):
        size = min(n_boot, start + rows) - start
        seed_counts = resample_counts(rng, n_seeds, size)
        example_counts = resample_counts(rng, n_examples, size)
        out[start : start + size] = np.einsum("bs,se,be->b", seed_counts, diff, example_counts, optimize=True)
    return out / (n_seeds * n_examples)


def _nested_means(diff: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    n_seeds, n_examples = diff.shape
    rows = max(1, CHUNK_CELLS // (n_seeds * n_examples))
    out = np.empty(n_boot)
    for start in range(0, n_boot, rows):
        size = min(n_boot, start + rows) - start
        seed_idx = rng.integers(0, n_seeds, size=(size, n_seeds, 1))
        example_idx = rng.integers(0, n_examples, size=(size, n_seeds, n_examples))
        out[start : start + size] = diff[seed_idx, example_idx].mean(axis=(1, 2))
    return out


@dataclass(frozen=True)
class AtK:
    """Avg@k or Best@k over ``n`` runs with its uncertainty: ``se`` (standard error of the
    estimate over runs) and a t interval with ``n - 1`` degrees of freedom. ``method`` says how
    ``se`` was found, or why there is none (``low``/``high``/``se`` are NaN then)."""

    statistic: str
    k: int
    n: int
    estimate: float
    se: float
    low: float
    high: float
    level: float
    method: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _t_interval(estimate: float, se: float, n: int, level: float) -> tuple[float, float]:
    q = float(scipy_stats.t.ppf(0.5 + level / 2, n - 1))
    return estimate - q * se, estimate + q * se


def avg_at_k_interval(seed_scores: Any, k: int | None = None, *, ci: float = 0.95) -> AtK:
    """Avg@k with the standard error of a mean of ``n`` runs (``sd / sqrt(n)``, ddof=1)."""
    scores = as_scores(seed_scores, "seed_scores")
    n = scores.shape[0]
    k = _check_k(k, n)
    level = check_level(ci)
    estimate = float(scores.mean())
    if n < 2:
        return AtK("avg@k", k, n, estimate, math.nan, math.nan, math.nan, level, "undefined: needs >= 2 runs")
    se = float(scores.std(ddof=1)) / math.sqrt(n)
    return AtK("avg@k", k, n, estimate, se, *_t_interval(estimate, se, n, level), level, "t over runs")


def best_at_k_interval(seed_scores: Any, k: int, *, ci: float = 0.95) -> AtK:
    """Best@k with a jackknife standard error over runs (leave one run out, recompute the
    unbiased Best@k on the other ``n - 1``). Needs ``n >= k + 1`` runs: Best@n of n runs is a
    single maximum with no replicate to say how it would move."""
    scores = as_scores(seed_scores, "seed_scores")
    n = scores.shape[0]
    k = _check_k(k, n)
    level = check_level(ci)
    estimate = best_at_k(scores, k)
    if n < k + 1 or n < 2:
        return AtK("best@k", k, n, estimate, math.nan, math.nan, math.nan, level, f"undefined: needs >= {k + 1} runs")
    loo = np.array([best_at_k(np.delete(scores, i), k) for i in range(n)])
    se = math.sqrt((n - 1) / n * float(np.sum((loo - loo.mean()) ** 2)))
    return AtK("best@k", k, n, estimate, se, *_t_interval(estimate, se, n, level), level, "jackknife over runs")
