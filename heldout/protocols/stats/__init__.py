"""Paired, honest statistics over plain numpy arrays (no run records, no reports here).

* per example, paired: :func:`paired_comparison` (bootstrap CI, Wilcoxon, paired t, dz,
  win/tie/loss, a verdict that says when the data cannot separate the arms);
* across seeds: :func:`summarize_seeds`, :func:`avg_at_k`, :func:`best_at_k`,
  :func:`two_level_bootstrap`, :func:`separates`;
* across tasks: :func:`macro_mean`, :func:`win_counts`, :func:`correct_pvalues`;
* planning: :func:`required_sample_size`, :func:`achieved_power`, :func:`minimum_detectable_dz`;
* the CI gate: :func:`regression_check`.

Scores are higher-is-better; NaN/inf and mismatched pairings raise :class:`StatsInputError`.
"""

from ._checks import StatsInputError
from .bootstrap import Interval, mean_interval
from .gate import GateResult, regression_check
from .paired import WILCOXON_ZERO_METHOD, PairedComparison, paired_comparison
from .power import achieved_power, minimum_detectable_dz, required_sample_size
from .seeds import SeedSummary, TwoLevelInterval, avg_at_k, best_at_k, separates, summarize_seeds, two_level_bootstrap
from .tasks import Correction, WinCount, correct_pvalues, macro_mean, win_counts

__all__ = [
    "StatsInputError",
    "Interval",
    "mean_interval",
    "PairedComparison",
    "paired_comparison",
    "WILCOXON_ZERO_METHOD",
    "SeedSummary",
    "summarize_seeds",
    "avg_at_k",
    "best_at_k",
    "separates",
    "TwoLevelInterval",
    "two_level_bootstrap",
    "macro_mean",
    "WinCount",
    "win_counts",
    "Correction",
    "correct_pvalues",
    "required_sample_size",
    "achieved_power",
    "minimum_detectable_dz",
    "GateResult",
    "regression_check",
]
