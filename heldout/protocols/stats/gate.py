"""The regression gate's decision: regression, pass, or inconclusive, with the run as the unit.

Per task, with margin ``m`` (:class:`~.margin.Margin`: score units, a fraction of the task's
baseline score, of its headroom, or run-to-run SDs; applied on each task's own scale) and
``change = current - baseline`` over per-run scores (:mod:`.runs`):

* **regression** test, H0 ``change >= -m`` vs H1 ``change < -m``: the drop is larger than the
  tolerated one. One-sided at ``alpha``; Holm-adjusted over the tasks, so the chance of calling
  any regression when none exists is at most ``alpha`` (family-wise);
* **non-inferiority** test, H0 ``change <= -m`` vs H1 ``change > -m``: the current runs are at
  most ``m`` worse. One-sided at ``alpha``; the gate passes only when every task shows it (an
  intersection-union test, level ``alpha`` without correction);
* **equivalence** (TOST): non-inferiority plus H1 ``change < +m``; reported, not required.

Outcome: regression (exit 1) if any task's regression test rejects; pass (exit 0) if every task
is non-inferior; otherwise inconclusive (exit 2): the data cannot tell, and the evidence says how
many seeds would. With ``min_effect = 0`` a pass needs a significant improvement: set the
margin to the largest drop you would accept. No margin tolerates losing more than half the
baseline's score (:data:`~.margin.MAX_DROP_SHARE`): a wider one is capped there, so a collapse to 0
never passes. Runs that reproduce exactly (every paired
difference, or every run of both arms, equal within the tie tolerance) pass as "identical".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping

import numpy as np

from ._checks import StatsInputError, as_scores, check_alpha
from .margin import MAX_DROP_SHARE, Margin, sd_margin_p
from .runs import (
    RunComparison,
    choose_test,
    compare_runs,
    permutation_p,
    seeds_needed,
    shift_p,
    sign_flip_p,
    t_moments,
    t_shift_p,
    tie_tolerance,
)

Outcome = Literal["regression", "pass", "inconclusive"]
EXIT_CODES: dict[str, int] = {"pass": 0, "regression": 1, "inconclusive": 2}
"""``heldout check`` exit status per outcome; invalid input (a clear error) also exits 2."""


@dataclass(frozen=True)
class TaskRuns:
    """One task's held-out scores: ``base[s, e]`` / ``cur[s, e]`` is run s's score on example e
    (the same examples, in the same order, for every run of both arms). With ``paired`` the
    rows are seed pairs (row s of both arms ran on the same seed)."""

    base: np.ndarray
    cur: np.ndarray
    paired: bool
    unreplicated: str = ""
    """Why one side's runs replicate nothing the comparison needs (e.g. one candidate of a prompt
    task re-scored in every run, with no placebo draws to stand for its wording's luck): the
    task is inconclusive, whatever the numbers, and this is its reason."""

    def __post_init__(self) -> None:
        base = as_scores(self.base, "baseline runs x examples", ndim=2)
        cur = as_scores(self.cur, "current runs x examples", ndim=2)
        if base.shape[1] != cur.shape[1]:
            raise StatsInputError(f"baseline and current runs must score the same examples, got {base.shape[1]} "
                                  f"and {cur.shape[1]} columns")
        if self.paired and base.shape[0] != cur.shape[0]:
            raise StatsInputError(f"paired seeds need as many baseline as current runs, got {base.shape[0]} and {cur.shape[0]}")
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "cur", cur)

    @property
    def n_examples(self) -> int:
        return int(self.base.shape[1])


@dataclass(frozen=True)
class TaskDecision:
    """The gate on one task: the run-level comparison, the three one-sided p-values (raw; the
    regression p also Holm-adjusted over tasks), the outcome and a sentence saying why."""

    task: str
    outcome: str
    comparison: RunComparison
    p_regression: float
    p_regression_holm: float
    p_noninferior: float
    p_equivalent: float
    identical: bool
    reason: str
    margin: float = 0.0  # the tolerated drop in score units at the observed baseline mean
    capped: str = ""  # the margin as given, when it would have tolerated a collapse and was capped

    def as_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "comparison"}, "comparison": self.comparison.as_dict()}


@dataclass(frozen=True)
class GateResult:
    """Outcome over all tasks plus the per-task decisions and a printable ``evidence``."""

    outcome: str
    alpha: float
    min_effect: str  # the margin as given (``0.01``, ``5%``, ``10% headroom``, ``0.5sd``)
    tasks: list[TaskDecision] = field(default_factory=list)
    evidence: str = ""

    @property
    def regressed(self) -> bool:
        return self.outcome == "regression"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    def as_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "exit_code": self.exit_code, "alpha": self.alpha,
                "min_effect": self.min_effect, "tasks": [t.as_dict() for t in self.tasks], "evidence": self.evidence}


# -- the decision rule, batched ----------------------------------------------------------------------
def holm_adjust(p: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values along the last axis (equal to statsmodels
    ``multipletests(method="holm")``, batched)."""
    p = np.asarray(p, dtype=np.float64)
    k = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1) * (k - np.arange(k))
    adjusted_sorted = np.minimum(np.maximum.accumulate(ranked, axis=-1), 1.0)
    out = np.empty_like(adjusted_sorted)
    np.put_along_axis(out, order, adjusted_sorted, axis=-1)
    return out


def decide(p_regression: np.ndarray, p_noninferior: np.ndarray, alpha: float) -> np.ndarray:
    """Outcome codes (0 pass, 1 regression, 2 inconclusive) from per-task p-values of shape
    ``(..., tasks)``: regression if any Holm-adjusted regression p <= alpha, else pass if every
    non-inferiority p <= alpha, else inconclusive."""
    regressed = np.any(holm_adjust(p_regression) <= alpha, axis=-1)
    passed = np.all(np.asarray(p_noninferior) <= alpha, axis=-1)
    return np.where(regressed, 1, np.where(passed, 0, 2))


def batched_pvalues(base: np.ndarray, cur: np.ndarray, *, n_examples: int, paired: bool,
                    min_effect: float) -> tuple[np.ndarray, np.ndarray]:
    """``(p_regression, p_noninferior)`` for a batch of designs: ``base`` (..., S_b) and ``cur``
    (..., S_c) hold per-run scores. The same tests, margin and identical-runs rule as
    :func:`regression_check`, as array operations (for simulations of the gate)."""
    base = np.asarray(base, dtype=np.float64)
    cur = np.asarray(cur, dtype=np.float64)
    m = float(min_effect)
    test = choose_test(n_examples, paired)
    if test.endswith(" t"):
        change, se, df = t_moments(base, cur, paired=paired)
        p_reg, p_non = t_shift_p(change, se, df, -m, "less"), t_shift_p(change, se, df, -m, "greater")
    elif test == "exact sign-flip":
        p_reg, p_non = sign_flip_p(cur - base, -m, "less"), sign_flip_p(cur - base, -m, "greater")
    else:
        p_reg, p_non = permutation_p(base, cur, -m, "less"), permutation_p(base, cur, -m, "greater")
    tol = tie_tolerance(base, cur)
    if paired:
        identical = np.all(np.abs(cur - base) <= tol, axis=-1)
    else:
        rows = np.concatenate([base, cur], axis=-1)
        identical = np.all(np.abs(rows - rows[..., :1]) <= tol, axis=-1)
    return np.where(identical, 1.0, p_reg), np.where(identical, 0.0, p_non)


# -- the gate ----------------------------------------------------------------------------------------
def _identical(runs: TaskRuns) -> bool:
    tol = tie_tolerance(runs.base, runs.cur)
    if runs.paired:
        return bool(np.all(np.abs(runs.cur - runs.base) <= tol))
    rows = np.r_[runs.base, runs.cur]
    return bool(np.all(np.abs(rows - rows[0]) <= tol))


def _reproducible(runs: TaskRuns) -> bool:
    """Every run of each side scored every example the same (>= 2 runs a side): both sides are
    deterministic, so the change is known exactly and needs no test over seeds."""
    if min(runs.base.shape[0], runs.cur.shape[0]) < 2:
        return False
    tol = tie_tolerance(runs.base, runs.cur)
    return bool(np.all(np.abs(runs.base - runs.base[0]) <= tol) and np.all(np.abs(runs.cur - runs.cur[0]) <= tol))


def _why_inconclusive(comp: RunComparison, margin: float, alpha: float) -> str:
    n = min(comp.n_base, comp.n_cur)
    unit = "seed pairs" if comp.paired else "runs per arm"
    if n < comp.min_seeds:
        what = {"exact sign-flip": "an exact sign-flip over seeds", "exact permutation": "an exact permutation test over runs"}
        return (f"cannot separate: {what.get(comp.test, 'a t test over runs')} needs >= {comp.min_seeds} {unit} "
                f"to reach alpha={alpha:g}, got {n}")
    sd = comp.run_sd_diff if comp.paired else max(comp.run_sd_base, comp.run_sd_cur)
    distance = abs(comp.change + margin)
    k = seeds_needed(sd, distance, alpha=alpha, paired=comp.paired)
    if k is None:
        hint = " (with --min-effect 0 only a significant improvement passes)" if margin == 0 else ""
        return (f"cannot separate: the change {comp.change:+.4g} sits at the margin {-margin:+.4g}; no feasible "
                f"number of seeds decides it at run-to-run SD {sd:.3g}{hint}")
    return f"cannot separate: need >= {max(k, n + 1)} {unit} at the observed run-to-run SD {sd:.3g}"


def task_decision(name: str, runs: TaskRuns, *, alpha: float, min_effect: "float | str | Margin",
                  ceiling: float | None = None) -> TaskDecision:
    """The three tests on one task (regression p not yet adjusted over tasks). An absolute
    margin shifts the null (``change = -m``); the other forms test the current runs against the
    baseline's per-run line moved by the margin (:meth:`Margin.lower_line`), which is exact for
    the relative and headroom forms."""
    asked = Margin.parse(min_effect)
    base_means, cur_means = runs.base.mean(axis=1), runs.cur.mean(axis=1)
    comp = compare_runs(base_means, cur_means, paired=runs.paired, n_examples=runs.n_examples, alpha=alpha,
                        two_sided=False)
    identical = _identical(runs)
    # no form may tolerate losing more than MAX_DROP_SHARE of the baseline (a collapse never passes)
    margin = asked.capped(base_means, ceiling) if asked.kind != "sd" else asked
    m = margin.resolve_runs(base_means, cur_means, ceiling)
    if margin.kind == "sd" and m > MAX_DROP_SHARE * float(np.mean(base_means)) > 0:
        margin = Margin("relative", MAX_DROP_SHARE)
        m = margin.resolve(base_means, ceiling)
    capped = str(asked) if margin != asked else ""
    if identical:
        p_reg, p_non, p_eq = 1.0, 0.0, 0.0
    elif runs.unreplicated:
        p_reg, p_non, p_eq = 1.0, 1.0, 1.0
    elif _reproducible(runs) and margin.kind != "sd":
        # both sides repeat one exact score: the change against the margin line is a fact, not an estimate
        gap = float(np.mean(cur_means)) - float(np.mean(margin.lower_line(base_means, ceiling)))
        p_reg, p_non = (0.0, 1.0) if gap < 0 else (1.0, 0.0)
        p_eq = 0.0 if abs(comp.change) < m else 1.0
    elif margin.kind == "absolute":
        def p(theta0: float, side: str) -> float:
            return shift_p(comp.test, base_means, cur_means, theta0, side, change=comp.change, se=comp.se, df=comp.df)  # type: ignore[arg-type]

        p_reg, p_non = p(-m, "less"), p(-m, "greater")
        p_eq = max(p_non, p(m, "less")) if m > 0 else 1.0
    elif margin.kind == "sd":
        k = margin.value
        p_reg, p_non = sd_margin_p(base_means, cur_means, k, "less"), sd_margin_p(base_means, cur_means, k, "greater")
        p_eq = max(p_non, sd_margin_p(base_means, cur_means, -k, "less")) if m > 0 else 1.0
    else:
        low, high = margin.lower_line(base_means, ceiling), margin.upper_line(base_means, ceiling)
        p_reg = shift_p(comp.test, low, cur_means, 0.0, "less")
        p_non = shift_p(comp.test, low, cur_means, 0.0, "greater")
        p_eq = max(p_non, shift_p(comp.test, high, cur_means, 0.0, "less")) if m > 0 else 1.0
    return TaskDecision(name, "", comp, p_reg, p_reg, p_non, p_eq, identical, "", m, capped)


def regression_check(
    tasks: Mapping[str, TaskRuns],
    *,
    alpha: float = 0.05,
    min_effect: "float | str | Margin" = 0.0,
    ceilings: Mapping[str, float] | None = None,
) -> GateResult:
    """Decide whether the current runs regressed against the baseline runs, task by task (see
    the module docstring for the three tests and the outcome rule). ``min_effect`` is a
    :class:`Margin` or its text (``0.01``, ``5%``, ``10% headroom``, ``0.5sd``), applied to each
    task on its own scale; ``ceilings`` gives each task's score ceiling (headroom margins)."""
    alpha = check_alpha(alpha)
    margin = Margin.parse(min_effect)
    if not tasks:
        raise StatsInputError("the gate needs at least one task to compare")
    ceilings = ceilings or {}
    raw = [task_decision(name, runs, alpha=alpha, min_effect=margin, ceiling=ceilings.get(name))
           for name, runs in tasks.items()]
    p_reg = np.array([d.p_regression for d in raw])
    p_non = np.array([d.p_noninferior for d in raw])
    holm = holm_adjust(p_reg)
    outcome = {0: "pass", 1: "regression", 2: "inconclusive"}[int(decide(p_reg, p_non, alpha))]
    decided = []
    for d, adj in zip(raw, holm):
        comp = d.comparison
        m = d.margin
        of = "" if margin.kind == "absolute" else f" ({margin.describe()})"
        if d.capped:
            of = f" (capped from {d.capped}: at most {MAX_DROP_SHARE:.0%} of the baseline's score)"
        if adj <= alpha:
            kind, reason = "regression", (f"the drop {-comp.change:.4g} exceeds min-effect {m:.4g}{of} "
                                          f"(Holm p={adj:.3g} <= {alpha:g})")
        elif d.identical:
            kind, reason = "pass", "identical: every run reproduced the baseline within the tie tolerance"
        elif d.p_noninferior <= alpha:
            eq = (f"; equivalent within +-{m:.4g} (TOST p={d.p_equivalent:.3g})"
                  if d.p_equivalent <= alpha else "")
            kind, reason = "pass", f"non-inferior: the change is > {-m:+.4g}{of} (p={d.p_noninferior:.3g}){eq}"
        elif tasks[d.task].unreplicated:
            kind, reason = "inconclusive", f"cannot separate: {tasks[d.task].unreplicated}"
        else:
            kind, reason = "inconclusive", _why_inconclusive(comp, m, alpha)
        decided.append(TaskDecision(d.task, kind, comp, d.p_regression, float(adj), d.p_noninferior, d.p_equivalent,
                                    d.identical, reason, m, d.capped))
    result = GateResult(outcome, alpha, str(margin), decided)
    object.__setattr__(result, "evidence", describe(result))
    return result


def describe(result: GateResult) -> str:
    """The gate's evidence: one headline, then one block per task."""
    counts = {k: sum(t.outcome == k for t in result.tasks) for k in EXIT_CODES}
    head = {"regression": "REGRESSION", "pass": "PASS", "inconclusive": "INCONCLUSIVE"}[result.outcome]
    level = f"{1 - 2 * result.alpha:.0%}"
    lines = [f"{head}: {counts['regression']} regressed, {counts['pass']} passed, {counts['inconclusive']} "
             f"inconclusive of {len(result.tasks)} task(s); one-sided tests at alpha={result.alpha:g} against "
             f"min-effect {result.min_effect} per task (regression p Holm-adjusted over tasks; pass needs every task "
             f"non-inferior)"]
    for t in result.tasks:
        c = t.comparison
        unit = f"{c.n_base} seed pairs" if c.paired else f"{c.n_base} baseline / {c.n_cur} current runs"
        sd = f"run-to-run SD {c.run_sd_diff:.3g} (paired diff)" if c.paired else (
            f"run-to-run SD {c.run_sd_base:.3g} baseline / {c.run_sd_cur:.3g} current")
        lines.append(f"  {t.task}: {t.outcome.upper()}: {t.reason}")
        if t.capped:
            lines.append(f"    margin capped: --min-effect {t.capped} would tolerate losing more than "
                         f"{MAX_DROP_SHARE:.0%} of the baseline's score (a collapse would pass); held to {MAX_DROP_SHARE:.0%}")
        lines.append(f"    margin {t.margin:.4g} in score units ({t.margin / abs(c.mean_base):.1%} of the baseline's "
                     f"{c.mean_base:.4g})" if c.mean_base else f"    margin {t.margin:.4g} in score units")
        lines.append(f"    {c.test} over {unit} x {c.n_examples} example(s): baseline {c.mean_base:.4g} -> current "
                     f"{c.mean_cur:.4g}, change {c.change:+.4g}, {level} CI [{c.low:+.4g}, {c.high:+.4g}], {sd}; "
                     f"p(regression)={t.p_regression:.3g}, p(non-inferior)={t.p_noninferior:.3g}")
    return "\n".join(lines)
