"""Across tasks: macro mean (with an interval), IQM, probability of improvement, per-baseline win
counts, multiple-comparison corrections."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests

from ._checks import StatsInputError, as_scores, check_alpha, check_level, check_n_boot
from .bootstrap import percentile_interval
from .gate import holm_adjust
from .runs import run_verdict

CorrectionMethod = Literal["holm", "fdr_bh", "bonferroni", "fdr_by"]
CORRECTION_METHODS: tuple[str, ...] = ("holm", "fdr_bh", "bonferroni", "fdr_by")


def macro_mean(per_task: Mapping[str, float]) -> float:
    """Unweighted mean over tasks: every task counts once, however many examples it has."""
    if not per_task:
        raise StatsInputError("macro_mean needs at least one task")
    values = as_scores([per_task[name] for name in per_task], "per_task scores")
    return float(values.mean())


@dataclass(frozen=True)
class WinCount:
    """``method`` against ``baseline`` over ``tasks`` tasks, comparing mean-over-seeds scores.
    ``separated_wins`` / ``separated_losses`` count only tasks where the seeds separate the two
    (:func:`~.runs.run_verdict`: an exact permutation test over seeds; Holm-adjusted over the
    tasks), never seed ranges alone."""

    method: str
    baseline: str
    tasks: int
    wins: int
    ties: int
    losses: int
    separated_wins: int
    separated_losses: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def win_counts(
    table: Mapping[str, Mapping[str, Sequence[float]]],
    baselines: Sequence[str],
    *,
    n_examples: int | Mapping[str, int] = 2,
    alpha: float = 0.05,
) -> list[WinCount]:
    """Win/tie/loss counts of every method against each baseline. ``table[method][task]`` is
    that cell's per-seed scores; every method must cover the same tasks. ``n_examples`` (per task,
    or one number) is how many held-out examples a seed's score averages: it picks the test."""
    if not table:
        raise StatsInputError("win_counts needs at least one method")
    tasks = sorted(next(iter(table.values())))
    for method, cells in table.items():
        if sorted(cells) != tasks:
            missing = sorted(set(tasks) ^ set(cells))
            raise StatsInputError(f"method {method!r} does not cover the same tasks as the others (differs on {missing})")
    unknown = [name for name in baselines if name not in table]
    if unknown:
        raise StatsInputError(f"baseline(s) {unknown} not in the table (methods: {sorted(table)})")
    scores = {
        method: {task: as_scores(cells[task], f"table[{method!r}][{task!r}]") for task in tasks}
        for method, cells in table.items()
    }
    counts: list[WinCount] = []
    for baseline in baselines:
        for method in table:
            if method == baseline:
                continue
            delta = np.array([scores[method][t].mean() - scores[baseline][t].mean() for t in tasks])
            split = _separated(scores[baseline], scores[method], tasks, n_examples, alpha)
            counts.append(
                WinCount(
                    method=method,
                    baseline=baseline,
                    tasks=len(tasks),
                    wins=int(np.count_nonzero(delta > 0)),
                    ties=int(np.count_nonzero(delta == 0)),
                    losses=int(np.count_nonzero(delta < 0)),
                    separated_wins=sum(s and d > 0 for s, d in zip(split, delta)),
                    separated_losses=sum(s and d < 0 for s, d in zip(split, delta)),
                )
            )
    return counts


def _separated(base: Mapping[str, np.ndarray], cur: Mapping[str, np.ndarray], tasks: Sequence[str],
               n_examples: int | Mapping[str, int], alpha: float) -> list[bool]:
    """Per task, whether the seeds separate ``cur`` from ``base`` (Holm over the tasks)."""
    pvals = []
    for t in tasks:
        n = n_examples if isinstance(n_examples, int) else n_examples.get(t, 2)
        if min(base[t].shape[0], cur[t].shape[0]) < 2:
            pvals.append(1.0)
            continue
        verdict = run_verdict(base[t], cur[t], n_examples=max(1, n), alpha=alpha)
        pvals.append(verdict.p if verdict.comparison.low > 0 or verdict.comparison.high < 0 else 1.0)
    return [bool(p <= alpha) for p in holm_adjust(np.array(pvals))] if pvals else []


@dataclass(frozen=True)
class Correction:
    """p-values adjusted for testing ``len(names)`` hypotheses together, by
    ``statsmodels.stats.multitest.multipletests`` with ``method``."""

    method: str
    alpha: float
    names: tuple[str, ...]
    p_raw: tuple[float, ...]
    p_adjusted: tuple[float, ...]
    reject: tuple[bool, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "alpha": self.alpha,
            "tests": [
                {"name": n, "p_raw": p, "p_adjusted": q, "reject": r}
                for n, p, q, r in zip(self.names, self.p_raw, self.p_adjusted, self.reject)
            ],
        }


def correct_pvalues(
    pvalues: Mapping[str, float] | Sequence[float],
    *,
    method: CorrectionMethod,
    alpha: float = 0.05,
) -> Correction:
    """Adjust p-values for multiple comparisons. ``method`` has no default on purpose: a report
    must say which family-wise ("holm", "bonferroni") or false-discovery ("fdr_bh",
    "fdr_by") control it applied."""
    if method not in CORRECTION_METHODS:
        raise StatsInputError(f"method must be one of {CORRECTION_METHODS}, got {method!r}")
    alpha = check_alpha(alpha)
    if isinstance(pvalues, Mapping):
        names = tuple(str(k) for k in pvalues)
        raw = as_scores(list(pvalues.values()), "pvalues")
    else:
        raw = as_scores(pvalues, "pvalues")
        names = tuple(str(i) for i in range(raw.shape[0]))
    if np.any((raw < 0) | (raw > 1)):
        raise StatsInputError(f"pvalues must lie in [0, 1], got {raw[(raw < 0) | (raw > 1)].tolist()}")
    reject, adjusted, _, _ = multipletests(raw, alpha=alpha, method=method)
    return Correction(
        method=method,
        alpha=alpha,
        names=names,
        p_raw=tuple(float(p) for p in raw),
        p_adjusted=tuple(float(q) for q in adjusted),
        reject=tuple(bool(r) for r in reject),
    )


# -- aggregates over tasks with uncertainty (rliable-style, own implementation) ----------------------
MIN_BOOTSTRAP_RUNS = 5
"""Fewest runs per task and method for a bootstrap over runs: below it a resample of runs
mostly repeats the few there are and the interval under-covers. Small-run fallbacks:
the macro mean uses a t interval over runs with the tasks fixed (Welch-Satterthwaite df);
IQM and probability of improvement report the point estimate only (no interval)."""
MIN_BOOTSTRAP_TASKS = 5
"""Fewest tasks for resampling tasks; with fewer, the macro-mean interval holds tasks fixed."""


@dataclass(frozen=True)
class Aggregate:
    """An across-task statistic with its interval; ``method`` says how the interval was made
    (or why there is none: then ``low``/``high`` are NaN)."""

    statistic: str
    estimate: float
    low: float
    high: float
    level: float
    method: str
    n_tasks: int
    min_runs: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


RunTable = Mapping[str, Sequence[float]]
"""``task -> per-run scores`` of one method."""


def _runs(table: RunTable, name: str) -> dict[str, np.ndarray]:
    if not table:
        raise StatsInputError(f"{name} needs at least one task")
    return {task: as_scores(values, f"{name}[{task!r}]") for task, values in table.items()}


def _paired_tasks(a: RunTable, b: RunTable | None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    ra = _runs(a, "scores")
    if b is None:
        return ra, None
    rb = _runs(b, "baseline")
    if sorted(ra) != sorted(rb):
        raise StatsInputError(f"both methods must cover the same tasks (differ on {sorted(set(ra) ^ set(rb))})")
    return ra, rb


def macro_mean_interval(scores: RunTable, baseline: RunTable | None = None, *, ci: float = 0.95,
                        n_boot: int = 10_000, seed: int = 0) -> Aggregate:
    """Interval for the macro mean over tasks of a method's mean run score (or, with
    ``baseline``, of the per-task difference of means). With >= ``MIN_BOOTSTRAP_TASKS`` tasks
    and >= ``MIN_BOOTSTRAP_RUNS`` runs everywhere: a two-level percentile bootstrap that resamples
    tasks, then runs within each drawn task (each arm separately). Otherwise a t interval with
    tasks fixed and runs random (variance sum of s_t^2 / n_t / T^2, Welch-Satterthwaite df)."""
    level = check_level(ci)
    ra, rb = _paired_tasks(scores, baseline)
    tasks = sorted(ra)
    arms = [ra] + ([rb] if rb is not None else [])
    sign = [1.0, -1.0]
    per_task = np.array([sum(s * arm[t].mean() for s, arm in zip(sign, arms)) for t in tasks])
    estimate = float(per_task.mean())
    min_runs = min(arm[t].shape[0] for arm in arms for t in tasks)
    n_tasks = len(tasks)
    name = "macro mean" + (" difference" if rb is not None else "")
    if n_tasks >= MIN_BOOTSTRAP_TASKS and min_runs >= MIN_BOOTSTRAP_RUNS:
        rng = np.random.default_rng(seed)
        n_boot = check_n_boot(n_boot)
        draws = rng.integers(0, n_tasks, size=(n_boot, n_tasks))
        boot = np.zeros(n_boot)
        for j, t in enumerate(tasks):
            # the mean of task j's resampled runs, for every bootstrap replicate
            value = np.zeros(n_boot)
            for s, arm in zip(sign, arms):
                runs = arm[t]
                value += s * runs[rng.integers(0, runs.shape[0], size=(n_boot, runs.shape[0]))].mean(axis=1)
            boot += (draws == j).sum(axis=1) * value
        boot /= n_tasks
        low, high = percentile_interval(boot, level)
        return Aggregate(name, estimate, low, high, level, "two-level bootstrap (tasks, then runs)", n_tasks, min_runs)
    if min_runs < 2:
        return Aggregate(name, estimate, math.nan, math.nan, level, "undefined: needs >= 2 runs per task", n_tasks, min_runs)
    parts = np.array([sum(arm[t].var(ddof=1) / arm[t].shape[0] for arm in arms) for t in tasks]) / n_tasks**2
    dfs = np.array([arm[t].shape[0] - 1 for t in tasks for arm in arms])
    pieces = np.array([arm[t].var(ddof=1) / arm[t].shape[0] / n_tasks**2 for t in tasks for arm in arms])
    var = float(parts.sum())
    if var == 0:
        return Aggregate(name, estimate, estimate, estimate, level, "degenerate: every run agrees", n_tasks, min_runs)
    df = var**2 / float(np.sum(pieces**2 / dfs))
    q = float(scipy_stats.t.ppf(0.5 + level / 2, df))
    half = q * math.sqrt(var)
    why = "few tasks" if n_tasks < MIN_BOOTSTRAP_TASKS else "few runs"
    return Aggregate(name, estimate, estimate - half, estimate + half, level,
                     f"t over runs, tasks fixed ({why}; df {df:.1f})", n_tasks, min_runs)


def iqm(scores: RunTable) -> float:
    """Interquartile mean of every run score of every task (25% trimmed from each end,
    ``scipy.stats.trim_mean``). Tasks must share a scale: normalise them first if not."""
    runs = _runs(scores, "scores")
    return float(scipy_stats.trim_mean(np.concatenate(list(runs.values())), 0.25))


def probability_of_improvement(scores: RunTable, baseline: RunTable) -> float:
    """P(a run of the method beats a run of the baseline on a task), ties counting half,
    averaged over tasks (the Mann-Whitney U / (n m) per task). Scale-free."""
    ra, rb = _paired_tasks(scores, baseline)
    return float(np.mean([_poi(ra[t], rb[t]) for t in sorted(ra)]))


def _poi(x: np.ndarray, y: np.ndarray) -> float:
    diff = x[:, None] - y[None, :]
    return float(np.mean(diff > 0) + 0.5 * np.mean(diff == 0))


def _stratified(statistic, arms: list[dict[str, np.ndarray]], level: float, n_boot: int, seed: int,
                name: str, estimate: float) -> Aggregate:
    tasks = sorted(arms[0])
    min_runs = min(arm[t].shape[0] for arm in arms for t in tasks)
    if min_runs < MIN_BOOTSTRAP_RUNS:
        return Aggregate(name, estimate, math.nan, math.nan, level,
                         f"point only: an interval needs >= {MIN_BOOTSTRAP_RUNS} runs per task", len(tasks), min_runs)
    rng = np.random.default_rng(seed)
    boot = np.empty(check_n_boot(n_boot))
    for i in range(boot.shape[0]):
        drawn = [{t: arm[t][rng.integers(0, arm[t].shape[0], arm[t].shape[0])] for t in tasks} for arm in arms]
        boot[i] = statistic(*drawn)
    low, high = percentile_interval(boot, level)
    return Aggregate(name, estimate, low, high, level, "stratified bootstrap over runs within tasks", len(tasks), min_runs)


def iqm_interval(scores: RunTable, *, ci: float = 0.95, n_boot: int = 2_000, seed: int = 0) -> Aggregate:
    """IQM with a stratified bootstrap interval (runs resampled within each task)."""
    runs = _runs(scores, "scores")
    stat = lambda r: float(scipy_stats.trim_mean(np.concatenate(list(r.values())), 0.25))  # noqa: E731
    return _stratified(stat, [runs], check_level(ci), n_boot, seed, "IQM", stat(runs))


def probability_of_improvement_interval(scores: RunTable, baseline: RunTable, *, ci: float = 0.95,
                                        n_boot: int = 2_000, seed: int = 0) -> Aggregate:
    """Probability of improvement with a stratified bootstrap interval."""
    ra, rb = _paired_tasks(scores, baseline)
    stat = lambda x, y: float(np.mean([_poi(x[t], y[t]) for t in sorted(x)]))  # noqa: E731
    return _stratified(stat, [ra, rb], check_level(ci), n_boot, seed, "probability of improvement", stat(ra, rb))
