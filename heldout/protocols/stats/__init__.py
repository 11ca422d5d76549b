"""Paired, honest statistics over plain numpy arrays (no run records, no reports here).

* the run as the unit of replication: :func:`compare_runs` (t over per-run means, or exact
  sign-flip / permutation over runs for single-instance tasks), run-to-run SD, seeds needed;
* per example, one run per arm: :func:`paired_comparison` (Tango score interval + exact
  McNemar for 0/1 scores, paired t interval + fixed-method Wilcoxon otherwise, win/tie/loss
  with a documented tie tolerance), :func:`paired_binary`;
* across seeds: :func:`summarize_seeds`, :func:`avg_at_k`, :func:`best_at_k` (and their
  ``*_interval`` forms), :func:`two_level_bootstrap`, :func:`separates`;
* across tasks: :func:`macro_mean` / :func:`macro_mean_interval`, :func:`iqm_interval`,
  :func:`probability_of_improvement_interval`, :func:`win_counts`, :func:`correct_pvalues`;
* planning: :func:`plan_gate`, :func:`required_sample_size`, :func:`achieved_power`,
  :func:`minimum_detectable_dz`;
* the CI gate: :func:`regression_check` (regression / pass / inconclusive).

Scores are higher-is-better; NaN/inf and mismatched pairings raise :class:`StatsInputError`.
The methods and why they were chosen: ``docs/statistics.md``.
"""

from ._checks import StatsInputError
from .binary import PairedBinary, paired_binary, tango_interval
from .bootstrap import Interval, mean_interval
from .gate import EXIT_CODES, GateResult, TaskDecision, TaskRuns, decide, holm_adjust, regression_check
from .paired import WILCOXON_EXACT_MAX, WILCOXON_ZERO_METHOD, PairedComparison, paired_comparison
from .power import GatePlan, achieved_power, minimum_detectable_dz, plan_gate, required_sample_size
from .runs import TIE_ATOL, TIE_RTOL, RunComparison, compare_runs, min_seeds_permutation, min_seeds_sign_flip
from .seeds import (
    AtK,
    SeedSummary,
    TwoLevelInterval,
    avg_at_k,
    avg_at_k_interval,
    best_at_k,
    best_at_k_interval,
    separates,
    summarize_seeds,
    two_level_bootstrap,
)
from .tasks import (
    Aggregate,
    Correction,
    WinCount,
    correct_pvalues,
    iqm,
    iqm_interval,
    macro_mean,
    macro_mean_interval,
    probability_of_improvement,
    probability_of_improvement_interval,
    win_counts,
)

__all__ = [
    "StatsInputError", "Interval", "mean_interval",
    "PairedBinary", "paired_binary", "tango_interval",
    "PairedComparison", "paired_comparison", "WILCOXON_ZERO_METHOD", "WILCOXON_EXACT_MAX",
    "RunComparison", "compare_runs", "min_seeds_sign_flip", "min_seeds_permutation", "TIE_ATOL", "TIE_RTOL",
    "SeedSummary", "summarize_seeds", "avg_at_k", "best_at_k", "AtK", "avg_at_k_interval", "best_at_k_interval",
    "separates", "TwoLevelInterval", "two_level_bootstrap",
    "macro_mean", "Aggregate", "macro_mean_interval", "iqm", "iqm_interval", "probability_of_improvement",
    "probability_of_improvement_interval", "WinCount", "win_counts", "Correction", "correct_pvalues",
    "required_sample_size", "achieved_power", "minimum_detectable_dz", "GatePlan", "plan_gate",
    "EXIT_CODES", "GateResult", "TaskDecision", "TaskRuns", "decide", "holm_adjust", "regression_check",
]
