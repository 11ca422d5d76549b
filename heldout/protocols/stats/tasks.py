"""Across tasks: macro mean, per-baseline win counts, multiple-comparison corrections."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np
from statsmodels.stats.multitest import multipletests

from ._checks import StatsInputError, as_scores, check_alpha
from .seeds import separates

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
    ``separated_wins`` / ``separated_losses`` count only tasks where the seed ranges do not
    overlap (:func:`separates`), the ones a table may bold without hedging."""

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
    min_seeds: int = 2,
) -> list[WinCount]:
    """Win/tie/loss counts of every method against each baseline. ``table[method][task]`` is
    that cell's per-seed scores; every method must cover the same tasks."""
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
            split = [separates(scores[method][t], scores[baseline][t], min_seeds=min_seeds) for t in tasks]
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
