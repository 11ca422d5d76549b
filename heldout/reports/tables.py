"""The report's tables, computed from verified runs with :mod:`heldout.protocols.stats`.

* :func:`results_table`  - Table 1: task x method, mean +/- std of the held-out score over seeds,
  best marked, n seeds, macro mean and win counts against the baseline;
* :func:`heldout_table`  - per task, each method against the baseline with the run as the unit
  (interval, test p and run-to-run SD over runs), per-example columns (Wilcoxon p, dz,
  win/tie/loss), Holm and Benjamini-Hochberg p across tasks, and a verdict that says "cannot
  separate" (and how many seeds would) when it can't;
* :func:`cost_table`     - optimisation tokens (worker-optimisation + architect + judge-optimisation),
  deployment tokens (worker- and judge-deployment), the judge's share, candidate length, held-out
  gain per million optimisation tokens;
* :func:`budget_table`   - best-so-far (optimizer-visible score) at metric-call checkpoints.

Rule: every table carries the settings it was computed under (split profile, visibility policy,
budget, tolerance, drift override) in its notes; mixed settings are flagged, not hidden.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from heldout.benchmarks.extraction import EXTRACTION_MODES, HEADLINE_MODE
from heldout.protocols.stats import (
    correct_pvalues,
    macro_mean,
    macro_mean_interval,
    paired_comparison,
    separates,
    summarize_seeds,
    win_counts,
)
from heldout.protocols.decide import Contrast, beyond_placebo
from heldout.protocols.placebo import PLACEBO_METHOD, stratum
from heldout.protocols.stats.runs import run_verdict
from heldout.reports.collect import Run, RunSet

OPTIMISATION_CHANNELS = ("worker-optimisation", "architect", "judge-optimisation")
DEPLOYMENT_CHANNELS = ("worker-deployment", "judge-deployment")
JUDGE_CHANNELS = ("judge-optimisation", "judge-deployment")  # a separate model-judge endpoint
SEPO_CHECKPOINTS = (500, 1000, 1500, 2000)


@dataclass(frozen=True)
class Cell:
    text: str
    strong: bool = False


@dataclass
class Table:
    """A rendered-ready table: display cells plus the numbers behind them (``data``, one dict
    per row) for ``results.json``. ``notes`` state the settings and how to read the table."""

    key: str
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    notes: list[str] = field(default_factory=list)
    data: list[dict[str, Any]] = field(default_factory=list)
    figure: str | None = None
    """The key of a report figure drawn right below this table (other figures close the report)."""

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "columns": self.columns,
                "rows": [[c.text for c in row] for row in self.rows], "notes": self.notes, "data": self.data,
                "figure": self.figure}


# -- helpers -----------------------------------------------------------------------------------------
def settings_note(runs: RunSet, tasks: Sequence[str] | None = None) -> str:
    """One line with the settings every table states. A setting that differs between tasks but
    is uniform within each is printed per task; one that differs within a task is printed as
    ``MIXED: a | b`` so nobody reads a mixed table as a matched one."""
    labels = {"profile": "split profile", "policy": "visibility policy", "budget": "budget",
              "tolerance": "tolerance", "drift": "data drift override", "worker model": "worker model",
              "verifier": "verifier", "prompt setting": "prompt setting"}
    chosen = list(tasks) if tasks else runs.tasks()
    per_task = {t: runs.settings(t) for t in chosen}
    parts = []
    for name, label in labels.items():
        values = sorted({v for t in chosen for v in per_task[t].get(name, ())})
        if not values and name == "prompt setting":
            continue  # program tasks have none
        if len(values) == 1:
            text = values[0]
        elif not values:
            text = "n/a"
        elif all(len(per_task[t].get(name, ())) == 1 for t in chosen):
            text = "per task: " + ", ".join(f"{t} {per_task[t][name][0]}" for t in chosen)
        else:
            text = "MIXED: " + " | ".join(values)
        parts.append(f"{label}: {text}")
    return "Settings - " + "; ".join(parts) + "."


def task_scale(runs: RunSet, task: str) -> tuple[str | None, float | None]:
    """(metric, score ceiling) of a task label's runs, from their experiment descriptions
    ((None, None) for runs that predate them, or when runs disagree)."""
    seen = {(r.record.experiment.get("metric"), r.record.experiment.get("score_ceiling"))
            for r in runs.runs if r.label == task}
    return next(iter(seen)) if len(seen) == 1 else (None, None)


def seed_scores(cell: dict[int, Run]) -> list[float]:
    return [float(run.record.test_score or 0.0) for run in cell.values()]


def example_means(cell: dict[int, Run]) -> dict[str, float]:
    """Per held-out example, its score averaged over the cell's seeds (examples every seed scored)."""
    per_seed = [run.test_scores() for run in cell.values()]
    common = set.intersection(*(set(s) for s in per_seed)) if per_seed else set()
    order = [ex for ex in per_seed[0] if ex in common] if per_seed else []
    return {ex: float(np.mean([s[ex] for s in per_seed])) for ex in order}


def tokens(run: Run, channels: Sequence[str]) -> int:
    used = run.record.usage.get("tokens", {})
    return int(sum(used.get(ch, {}).get("prompt", 0) + used.get(ch, {}).get("completion", 0) for ch in channels))


def candidate_length(run: Run) -> int:
    """Characters over all components of the final candidate (the prompt/program length)."""
    return sum(len(text) for text in (run.record.final_candidate or {}).values())


def decimals(values: Sequence[float], significant: int = 3) -> int:
    """Enough decimals to show ``significant`` digits of the smallest non-zero magnitude among
    ``values`` (geometry objectives are ~1e-3, accuracies ~1e-1), at least 3."""
    finite = [abs(v) for v in values if v is not None and math.isfinite(v) and v != 0]
    if not finite:
        return 3
    return max(3, min(8, significant - 1 - math.floor(math.log10(min(finite)))))


def fmt(value: float, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return f"{value:.{digits}f}"


def fmt_p(p: float) -> str:
    if p is None or math.isnan(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _strong_best(scores: dict[str, list[float]], n_examples: int) -> tuple[str | None, bool, str | None]:
    """The method with the best mean, whether its seeds separate it from the runner-up (the
    run-level test of :func:`heldout.protocols.stats.runs.run_verdict`; never ranges alone), and
    that test's name (None when no test ran: one method, or a side with < 2 seeds)."""
    if not scores:
        return None, False, None
    ranked = sorted(scores, key=lambda m: float(np.mean(scores[m])), reverse=True)
    if len(ranked) == 1 or min(len(scores[ranked[0]]), len(scores[ranked[1]])) < 2:
        return ranked[0], False, None
    verdict = run_verdict(scores[ranked[1]], scores[ranked[0]], n_examples=max(1, n_examples))
    return ranked[0], verdict.separable, verdict.comparison.test


def dagger_legend(tests: Iterable[str | None], alpha: float = 0.05) -> str:
    """Table 1's † legend, naming the test the marks came from."""
    named = sorted({t for t in tests if t})
    if not named:
        return "† marks no cell: no task had two methods with >= 2 seeds to test."
    return (f"† the best is not separated from the runner-up: two-sided {' / '.join(named)} over the seeds' scores "
            f"(the run is the unit) at alpha {alpha:g}, separated only when p < alpha and the interval of the "
            "difference excludes 0; a best with < 2 seeds, or alone, is not marked.")


def _examples_per_run(cells, task: str, methods) -> int:
    """How many held-out examples a run's score averages on ``task`` (picks the seed-level test)."""
    for m in methods:
        for run in (cells.get((task, m)) or {}).values():
            return len(run.record.test_verdicts) or 1
    return 1


def _interval_text(agg, digits: int) -> str:
    if not (math.isfinite(agg.low) and math.isfinite(agg.high)):
        return " [n/a]"
    return f" [{agg.low:.{digits}f}, {agg.high:.{digits}f}]"


# -- Table 1 -----------------------------------------------------------------------------------------
def unscored_seeds(runs: RunSet, label: str, method: str) -> list[int | None]:
    """Seeds of the cell (task label, method) whose run was excluded (no score in any table)."""
    return [ex.seed for ex in runs.excluded if ex.method == method and ex.task is not None
            and (label == ex.task or label.startswith(ex.task + " ["))]


def results_table(runs: RunSet, baseline: str | None = None) -> Table:
    cells = runs.cells()
    tasks, methods = runs.tasks(), runs.methods()
    rows, data = [], []
    tests_used: list[str | None] = []
    for task in tasks:
        scores = {m: seed_scores(cells[(task, m)]) for m in methods if (task, m) in cells}
        best, separated, test = _strong_best(scores, _examples_per_run(cells, task, methods))
        tests_used.append(test)
        row = [Cell(task)]
        for method in methods:
            lost = unscored_seeds(runs, task, method)
            lost_text = f" ‡ {len(lost)} seed(s) without a score" if lost else ""
            if method not in scores:
                row.append(Cell("-" + lost_text))
                continue
            summary = summarize_seeds(scores[method])
            digits = decimals([float(np.mean(v)) for v in scores.values()])
            mark = "" if method != best or separated or len(scores) == 1 else " †"
            row.append(Cell(f"{summary.format(digits)} (n={summary.k}){mark}{lost_text}", strong=method == best))
            data.append({"task": task, "method": method, "seeds": sorted(cells[(task, method)]),
                         **summary.as_dict(), "best": method == best, "best_separated": method == best and separated})
        rows.append(row)
    complete = [m for m in methods if all((t, m) in cells for t in tasks)]
    notes = [settings_note(runs),
             "Held-out (test) score, mean ± std over seeds (std with ddof=1; n = seeds). Bold: best mean "
             "per task; " + dagger_legend(tests_used)]
    if runs.excluded:
        notes.append("‡ seeds of this cell that have no score (incomplete: the infrastructure failed; interrupted; or "
                     "not verified): the mean is over the seeds that have one; see the warnings above.")
    if len(tasks) > 1 and complete:
        # a macro mean only over one scale: the same metric and ceiling, or each task's score
        # divided by its ceiling; never 2.54, 0.0028 and 0.5 averaged as they are
        scales = {t: task_scale(runs, t) for t in tasks}
        same = len(set(scales.values())) == 1 and None not in next(iter(scales.values()))
        normalise = not same and all(s[1] for s in scales.values())
        if same or normalise:
            div = {t: float(scales[t][1]) if normalise else 1.0 for t in tasks}
            per_run = {m: {t: [s / div[t] for s in seed_scores(cells[(t, m)])] for t in tasks} for m in complete}
            macro = {m: macro_mean({t: float(np.mean(v)) for t, v in per_run[m].items()}) for m in complete}
            spread = {m: macro_mean_interval(per_run[m], ci=0.95) for m in complete}
            d = decimals(list(macro.values()))
            label = "macro mean of score / task ceiling" if normalise else "macro mean"
            rows.append([Cell(label)] + [Cell(fmt(macro[m], d) + _interval_text(spread[m], d)) if m in macro
                                         else Cell("-") for m in methods])
            data += [{"task": label, "method": m, "mean": macro[m], "interval": spread[m].as_dict()} for m in complete]
            notes.append("Macro mean: unweighted over tasks, with a 95% interval over tasks and runs (two-level "
                         "bootstrap with >= 5 tasks and >= 5 runs, else a t interval over runs with the tasks fixed; "
                         "docs/statistics.md).")
            if normalise:
                notes.append("The tasks score on different scales, so the macro mean averages each task's score "
                             "divided by its ceiling (the reference or best possible score): " + "; ".join(
                                 f"{t}: {scales[t][1]:.6g}" for t in tasks) + ".")
        else:
            notes.append("No macro mean: the tasks score on different scales and not every task states a ceiling "
                         "to normalise by (" + "; ".join(f"{t}: {scales[t][0]}" for t in tasks) + ").")
    if baseline and baseline in methods and len(methods) > 1 and complete and baseline in complete:
        table = {m: {t: seed_scores(cells[(t, m)]) for t in tasks} for m in complete}
        counts = win_counts(table, [baseline], n_examples={t: _examples_per_run(cells, t, complete) for t in tasks})
        rows.append([Cell(f"wins/ties/losses vs {baseline}")] + [
            Cell(next((f"{c.wins}/{c.ties}/{c.losses} (sep. {c.separated_wins}/{c.separated_losses})"
                       for c in counts if c.method == m), "-")) for m in methods])
        notes.append("wins/ties/losses compare means over seeds per task; 'sep.' counts only tasks where the "
                     "seeds separate the two (exact permutation over seeds, "
                     "Holm over the tasks at 0.05): separated wins / separated losses.")
    return Table("results", "Table 1: held-out score by task and method", ["task"] + methods, rows, notes, data)


# -- held-out paired table -----------------------------------------------------------------------------
def heldout_table(runs: RunSet, baseline: str, *, alpha: float = 0.05, n_boot: int = 10_000) -> Table:
    cells = runs.cells()
    tasks, methods = runs.tasks(), [m for m in runs.methods() if m not in (baseline, PLACEBO_METHOD)]
    columns = ["task", "method", "n", "seeds", f"{baseline}", "method mean", "mean change", f"{(1 - alpha):.0%} CI",
               "run SD", "test p", "Wilcoxon p", "dz", "W/T/L", "Holm p", "BH p", "verdict"]
    comparisons: dict[tuple[str, str], dict[str, Any]] = {}
    for task in tasks:
        if (task, baseline) not in cells:
            continue
        base_cell = cells[(task, baseline)]
        base = example_means(base_cell)
        for method in methods:
            if (task, method) not in cells:
                continue
            cell = cells[(task, method)]
            b_vals, m_vals = base, example_means(cell)
            unit = "examples"
            n_examples = len([ex for ex in b_vals if ex in m_vals])
            if n_examples < 2:
                # A single-instance task (one held-out example): the seeds are the replicates.
                unit = "seeds"
                b_vals = {s: float(r.record.test_score or 0.0) for s, r in base_cell.items()}
                m_vals = {s: float(r.record.test_score or 0.0) for s, r in cell.items()}
            shared = [key for key in b_vals if key in m_vals]
            if not shared:
                continue
            result = paired_comparison([b_vals[k] for k in shared], [m_vals[k] for k in shared], n_boot=n_boot,
                                       ci=1 - alpha, labels=(baseline, method))
            # The conclusion: runs are the unit (per-run scores on the shared examples, an exact
            # permutation test over runs); with one run per arm only the per-example view.
            runs_level = None
            if min(len(cell), len(base_cell)) >= 2 and n_examples >= 1:
                ids = [ex for ex in base if ex in m_vals] if unit == "examples" else None
                per_run = lambda c: [float(np.mean([r.test_scores()[e] for e in ids])) if ids else  # noqa: E731
                                     float(r.record.test_score or 0.0) for r in c.values()]
                runs_level = run_verdict(per_run(base_cell), per_run(cell), n_examples=max(1, n_examples),
                                         alpha=alpha, labels=(baseline, method))
            floor = _placebo_floor(cells.get((task, PLACEBO_METHOD)), cell, per_run, alpha, (baseline, method)) \
                if runs_level is not None and baseline == "seed" else None
            comparisons[(task, method)] = {"result": result, "seeds": (len(base_cell), len(cell)), "unit": unit,
                                           "runs": runs_level, "floor": floor,
                                           "dropped": len(set(b_vals) ^ set(m_vals)) if unit == "examples" else 0,
                                           "seeds_separate": separates(seed_scores(cell), seed_scores(base_cell)),
                                           "enough_seeds": min(len(cell), len(base_cell)) >= 2}
    corrected: dict[tuple[str, str], dict[str, float]] = {}
    for method in methods:
        keys = [k for k in comparisons if k[1] == method]
        if not keys:
            continue
        pvals = {k[0]: _test_p(comparisons[k]) for k in keys}
        holm = correct_pvalues(pvals, method="holm", alpha=alpha)
        bh = correct_pvalues(pvals, method="fdr_bh", alpha=alpha)
        for i, task in enumerate(holm.names):
            corrected[(task, method)] = {"holm": holm.p_adjusted[i], "fdr_bh": bh.p_adjusted[i],
                                         "holm_reject": holm.reject[i]}
    rows, data, reasons = [], [], []
    for (task, method), info in sorted(comparisons.items()):
        res = info["result"]
        corr = corrected[(task, method)]
        verdict = _verdict(res, corr, info, alpha)
        d = decimals([res.mean_a, res.mean_b, res.mean_diff])
        rl = info["runs"]
        low, high = (rl.comparison.low, rl.comparison.high) if rl else (res.ci_low, res.ci_high)
        if info["floor"] is not None:
            low, high = info["floor"].low, info["floor"].high
        run_sd = (f"{fmt(rl.comparison.run_sd_base, d)}/{fmt(rl.comparison.run_sd_cur, d)}" if rl else "n/a (1 run)")
        rows.append([Cell(task), Cell(method), Cell(f"{res.n} {info['unit']}"),
                     Cell(f"{info['seeds'][0]}/{info['seeds'][1]}"),
                     Cell(fmt(res.mean_a, d)), Cell(fmt(res.mean_b, d)), Cell(f"{res.mean_diff:+.{d}f}"),
                     Cell(f"[{low:+.{d}f}, {high:+.{d}f}]" if math.isfinite(low) and math.isfinite(high) else "n/a"),
                     Cell(run_sd), Cell(fmt_p(_test_p(info))), Cell(fmt_p(res.wilcoxon_p)), Cell(fmt(res.dz, 2)),
                     Cell(f"{res.wins}/{res.ties}/{res.losses}"), Cell(fmt_p(corr["holm"])),
                     Cell(fmt_p(corr["fdr_bh"])),
                     # the cell holds the short verdict; its reasoning goes below the table
                     Cell(verdict.split(":", 1)[0], strong=not verdict.startswith("cannot separate"))])
        reasons.append(f"{task}, {method}: {verdict}")
        data.append({"task": task, "method": method, "baseline": baseline, "unit": info["unit"], **res.as_dict(),
                     **(rl.as_dict() if rl else {"run_level": None}),
                     "placebo_floor": info["floor"].as_dict() if info["floor"] is not None else None,
                     "seeds_baseline": info["seeds"][0], "seeds_method": info["seeds"][1],
                     "examples_unpaired": info["dropped"], "seed_ranges_separate": info["seeds_separate"],
                     "p_holm": corr["holm"], "p_fdr_bh": corr["fdr_bh"], "report_verdict": verdict})
    notes = [settings_note(runs),
             f"The unit of replication is the run: with >= 2 runs per arm the CI, test p and verdict compare "
             f"per-run held-out scores (an exact permutation test over runs on the shared examples, valid for any "
             f"law of run outcomes), and 'run SD' is the run-to-run SD of each arm ({baseline}/method). When the "
             f"study ran method {PLACEBO_METHOD!r} (neutral re-wordings of the seed, per seed), a method is compared "
             f"with them instead (rule placebo-floor: an exact stratified permutation), so a verdict means 'beyond "
             f"the seed's re-wording noise'; without them the seed's one score is the baseline and its wording's "
             f"luck is not measured. "
             f"With one run per arm only the per-example view exists and the verdict says run variance is unknown. "
             f"Per-example columns (n, W/T/L, Wilcoxon p, dz) pair examples averaged over a cell's seeds (change = "
             f"method - {baseline}); a single-instance task pairs seeds. One run per arm: 0/1 scores use the exact "
             f"McNemar test and Tango's score interval, other scores the paired t interval and a fixed-method "
             f"Wilcoxon (exact up to 25 non-zero differences, Pratt zeros). See docs/statistics.md.",
             f"Holm (family-wise) and Benjamini-Hochberg (false discovery) adjust the test p over the tasks "
             f"of each method (statsmodels multipletests 'holm' and 'fdr_bh'). A difference is called only "
             f"when the CI excludes 0 and the test p < {alpha:g}, also after Holm; otherwise the verdict says "
             f"'cannot separate' and why (with how many seeds would)."]
    notes += reasons
    dropped = sum(info["dropped"] for info in comparisons.values())
    if dropped:
        notes.append(f"{dropped} held-out example(s) were scored by only one arm and left out of the pairing.")
    if not any((t, baseline) in cells for t in tasks):
        notes.append(f"No runs of the baseline method {baseline!r}: nothing to pair against "
                     f"(methods present: {', '.join(runs.methods())}).")
    return Table("heldout", f"Held-out paired comparison against {baseline}", columns, rows, notes, data)


def _placebo_floor(placebo_cell: dict[int, Run] | None, cell: dict[int, Run], per_run, alpha: float,
                   labels: tuple[str, str]) -> Contrast | None:
    """Rule ``placebo-floor`` of ``cell``'s runs against the placebo draws of the same seeds (the
    study ran method ``placebo``), else None: the seed's one draw is then the only baseline."""
    if not placebo_cell:
        return None
    floors: dict[int, list[float]] = {}
    for placebo_seed, value in zip(placebo_cell, per_run(placebo_cell)):
        floors.setdefault(stratum(placebo_seed), []).append(value)
    if not all(floors.get(s) for s in cell):
        return None
    replayed = len({r.record.final_candidate_id for r in cell.values()}) == 1 and len(cell) > 1
    return beyond_placebo(floors, dict(zip(cell, per_run(cell))), n_examples=2, alpha=alpha,
                          labels=("placebo", labels[1]), label=f"{labels[1]} vs {labels[0]}", replayed=replayed)


def _test_p(info: dict[str, Any]) -> float:
    """The p-value a comparison's conclusion rests on: the placebo floor when the study ran one,
    else run-level when there are runs to compare, else the per-example exact test (McNemar for
    0/1, Wilcoxon otherwise)."""
    if info.get("floor") is not None:
        return info["floor"].p
    return info["runs"].p if info["runs"] is not None else info["result"].exact_p


def _verdict(res, corr: dict[str, float], info: dict[str, Any], alpha: float) -> str:
    floor = info.get("floor")
    if floor is not None:
        if floor.decided and not corr["holm_reject"]:
            return (f"cannot separate after Holm correction (p={corr['holm']:.3g} >= {alpha:g}); "
                    + floor.sentence.split(": ", 1)[1])
        return floor.sentence.split(": ", 1)[1]
    rl = info["runs"]
    if rl is None:
        head = "cannot separate: 1 run per arm says nothing about run-to-run variance (need >= 2 seeds per arm)"
        return f"{head}; these two runs: {res.verdict}"
    if res.wins == 0 and res.losses == 0 and rl.comparison.change == 0:
        return res.verdict
    if not rl.separable:
        return rl.verdict
    if not corr["holm_reject"]:
        return f"cannot separate after Holm correction (p={corr['holm']:.3g} >= {alpha:g}); {rl.verdict}"
    return rl.verdict


# -- Table 5 analogue: cost --------------------------------------------------------------------------
def cost_table(runs: RunSet, baseline: str | None = None) -> Table:
    cells = runs.cells()
    columns = ["task", "method", "optimisation tokens", "of which architect", "deployment tokens",
               "of which judge (both)", "candidate length (chars)", "held-out gain", "gain per 1M opt. tokens"]
    rows, data = [], []
    for (task, method), cell in cells.items():
        opt = float(np.mean([tokens(r, OPTIMISATION_CHANNELS) for r in cell.values()]))
        arch = float(np.mean([tokens(r, ("architect",)) for r in cell.values()]))
        dep = float(np.mean([tokens(r, DEPLOYMENT_CHANNELS) for r in cell.values()]))
        judge = float(np.mean([tokens(r, JUDGE_CHANNELS) for r in cell.values()]))
        length = float(np.mean([candidate_length(r) for r in cell.values()]))
        gain = per_million = None
        if baseline and (task, baseline) in cells and method != baseline:
            gain = float(np.mean(seed_scores(cell)) - np.mean(seed_scores(cells[(task, baseline)])))
            per_million = gain / (opt / 1e6) if opt > 0 else None
        rows.append([Cell(task), Cell(method), Cell(f"{opt:,.0f}"), Cell(f"{arch:,.0f}"), Cell(f"{dep:,.0f}"),
                     Cell(f"{judge:,.0f}"), Cell(f"{length:,.0f}"),
                     Cell("-" if gain is None else f"{gain:+.{decimals([gain])}f}"),
                     Cell("n/a (no tokens)" if gain is not None and per_million is None else
                          "-" if per_million is None else f"{per_million:+.3f}")])
        data.append({"task": task, "method": method, "optimisation_tokens": opt, "architect_tokens": arch,
                     "deployment_tokens": dep, "judge_tokens": judge, "candidate_chars": length, "gain": gain,
                     "gain_per_million_optimisation_tokens": per_million, "seeds": len(cell)})
    notes = [settings_note(runs),
             "Means over seeds. Optimisation tokens = worker-optimisation + architect + judge-optimisation channels "
             "(prompt + completion, cache hits excluded); deployment tokens = worker-deployment + judge-deployment "
             "(scoring the final candidate on val/test); a model judge's share of both is shown apart. "
             f"Gain = mean held-out score minus {baseline or 'the baseline'}'s; per 1M optimisation tokens. "
             "Program tasks spend no worker tokens, so their gain per token is n/a."]
    return Table("cost", "Table 5 analogue: optimisation and deployment cost", columns, rows, notes, data)


# -- budget-matched best-so-far ------------------------------------------------------------------------
def default_checkpoints(runs: Iterable[Run]) -> list[int]:
    """SEPO's call counts when the largest budget reaches them, else a quarter, half, three
    quarters and all of it."""
    budget = max((int(r.record.budget.get("metric_calls") or 0) for r in runs), default=0)
    if budget >= SEPO_CHECKPOINTS[-1]:
        return list(SEPO_CHECKPOINTS)
    return sorted({max(1, round(budget * q)) for q in (0.25, 0.5, 0.75, 1.0)}) if budget else []


def task_checkpoints(runs: RunSet) -> dict[str, list[int]]:
    """Task label -> its checkpoints, from that task's own budgets (a 20-call task is read at
    5/10/15/20 calls even beside a 2,000-call one)."""
    by_task: dict[str, list[Run]] = {}
    for run in runs.runs:
        by_task.setdefault(run.label, []).append(run)
    return {task: default_checkpoints(task_runs) for task, task_runs in sorted(by_task.items())}


def best_so_far(run: Run, checkpoint: int) -> float | None:
    """The optimizer-visible best score after at most ``checkpoint`` metric calls (None before
    the first scored candidate)."""
    value = None
    for point in run.record.trajectory:
        if point["metric_calls"] <= checkpoint:
            value = float(point["best_score"])
    return value


def budget_table(runs: RunSet, checkpoints: Sequence[int] | None = None) -> Table:
    """Best-so-far at metric-call checkpoints: the ``checkpoints`` given, for every task; by
    default each task's own (:func:`task_checkpoints`). When the tasks' own lists differ, the
    columns are the k-th checkpoint and each cell names its call count."""
    per_task = {task: list(checkpoints) for task in task_checkpoints(runs)} if checkpoints else task_checkpoints(runs)
    shared = len({tuple(points) for points in per_task.values()}) <= 1
    width = max((len(points) for points in per_task.values()), default=0)
    columns = ["task", "method"] + ([f"@{c} calls" for c in next(iter(per_task.values()), [])] if shared
                                    else [f"checkpoint {k + 1}" for k in range(width)])
    rows, data = [], []
    for (task, method), cell in runs.cells().items():
        row = [Cell(task), Cell(method)]
        entry: dict[str, Any] = {"task": task, "method": method, "checkpoints": {}}
        points = per_task.get(task, [])
        for c in points:
            values = [v for v in (best_so_far(r, c) for r in cell.values()) if v is not None]
            over = [r for r in cell.values() if int(r.record.budget.get("metric_calls") or 0) < c]
            if not values:
                row.append(Cell("-"))
                entry["checkpoints"][str(c)] = None
                continue
            summary = summarize_seeds(values)
            text = summary.format(decimals([summary.mean]))
            if summary.k < len(cell):
                text += f" (n={summary.k}/{len(cell)})"
            row.append(Cell(text + ("" if shared else f" @{c}") + (" ‡" if over else "")))
            entry["checkpoints"][str(c)] = {**summary.as_dict(), "beyond_budget_seeds": len(over)}
        row += [Cell("")] * (len(columns) - len(row))
        rows.append(row)
        data.append(entry)
    notes = [settings_note(runs),
             "Best-so-far is the score the optimizer could see (val mean when the candidate has val results, else "
             "train), from the run's ledger-derived trajectory; it is not the held-out score. Mean ± std over seeds; "
             "n < seeds when some seeds had no scored candidate yet. ‡ checkpoint beyond some runs' budget "
             "(their final value is carried forward)."]
    if not shared:
        notes.append("Each task is read at its own checkpoints (a quarter, half, three quarters and all of its "
                     "budget, or SEPO's 500/1000/1500/2000 calls); each cell names its call count.")
    return Table("budget", "Budget-matched best-so-far by metric calls", columns, rows, notes, data)


# -- answer-extraction modes side by side ----------------------------------------------------------
def mode_scores(run: Run) -> dict[str, float] | None:
    """The run's held-out score under each answer-extraction mode (mean over its test verdicts),
    or None when its verdicts do not carry every mode (program tasks, MBPP+)."""
    verdicts = run.record.test_verdicts
    if not verdicts or not all(set(EXTRACTION_MODES) <= set((v.get("dimensions") or {})) for v in verdicts):
        return None
    return {mode: float(np.mean([v["dimensions"][mode] for v in verdicts])) for mode in EXTRACTION_MODES}


def headline_mode(run: Run, scores: dict[str, float]) -> str:
    """The mode the run's score is: the one whose per-example values are its verdicts' scores
    (heldout's default, ``published``, when several modes agree on every example)."""
    verdicts = run.record.test_verdicts
    matching = [m for m in EXTRACTION_MODES
                if all(math.isclose(v["dimensions"][m], float(v.get("score") or 0.0)) for v in verdicts)]
    return HEADLINE_MODE if HEADLINE_MODE in matching or not matching else matching[0]


def extraction_modes_table(runs: RunSet) -> Table | None:
    """Per prompt task and method, the held-out score under each answer-extraction mode (strict,
    flexible, published: named filters reported side by side, as lm-eval does), the headline mode
    marked. None when no run carries the modes."""
    rows, data = [], []
    for (task, method), cell in runs.cells().items():
        per_run = {seed: mode_scores(run) for seed, run in cell.items()}
        if any(v is None for v in per_run.values()):
            continue
        headlines = {headline_mode(cell[seed], scores) for seed, scores in per_run.items()}
        headline = headlines.pop() if len(headlines) == 1 else None
        means = {m: float(np.mean([scores[m] for scores in per_run.values()])) for m in EXTRACTION_MODES}
        digits = decimals(list(means.values()))
        rows.append([Cell(task), Cell(method)]
                    + [Cell(fmt(means[m], digits) + (" (headline)" if m == headline else ""), strong=m == headline)
                       for m in EXTRACTION_MODES] + [Cell(headline or "MIXED")])
        data.append({"task": task, "method": method, "seeds": sorted(cell), "modes": means, "headline": headline})
    if not rows:
        return None
    notes = [settings_note(runs),
             "Held-out score, mean over seeds, with the answer read by each extraction mode: strict (the format's "
             "own cue only), flexible (strict, then fallbacks), published (the reference rule a published number "
             "used). Bold: the headline mode, the one every other table reports; a gap between modes is a "
             "formatting effect, not a reasoning one. MIXED: runs of one cell used different headlines."]
    return Table("extraction", "Held-out score by answer-extraction mode", ["task", "method", *EXTRACTION_MODES,
                                                                           "headline"], rows, notes, data)


def runs_table(runs: RunSet) -> Table:
    """Every run used, failed or excluded, with its path: the report's audit trail."""
    rows, data = [], []
    for run in runs.runs + runs.failed:
        rec = run.record
        status = "used" if rec.status == "ok" else f"FAILED: {rec.error}"
        # each score with enough decimals for its own scale (a Heilbronn 0.000562 is not "0.001")
        score = rec.test_score
        rows.append([Cell(run.label), Cell(rec.method), Cell(str(rec.seed)),
                     Cell("n/a" if score is None else fmt(score, decimals([score]))),
                     Cell(str(rec.usage.get("metric_calls"))), Cell(rec.ledger_head[:12]), Cell(status),
                     Cell(str(run.path))])
        data.append({"task": run.label, "method": rec.method, "seed": rec.seed, "test_score": rec.test_score,
                     "metric_calls": rec.usage.get("metric_calls"), "ledger_head": rec.ledger_head,
                     "status": rec.status, "error": rec.error, "path": str(run.path)})
    for ex in runs.excluded:
        rows.append([Cell("?"), Cell("?"), Cell("?"), Cell("-"), Cell("-"), Cell("-"),
                     Cell(f"EXCLUDED: {ex.reason}", strong=True), Cell(str(ex.path))])
        data.append({"status": "excluded", "reason": ex.reason, "path": str(ex.path)})
    return Table("runs", "Runs", ["task", "method", "seed", "test score", "metric calls", "ledger head",
                                  "status", "path"], rows, [], data)


def selection_table(runs: RunSet) -> Table:
    """Per method, as its runs' optimizers stated it (``final_selection`` and ``not_reproducible``
    events, kept in each record's ``extra``): which split selected the final candidate, and what
    the library could not make reproducible under a fixed seed. A method whose runs state nothing
    (user code need not) reads "not stated"; runs of one method that disagree list every answer."""
    by_method: dict[str, list[Run]] = {}
    for run in runs.runs + runs.failed:
        by_method.setdefault(run.record.method, []).append(run)
    rows, data = [], []
    for method, group in sorted(by_method.items()):
        selections = sorted({(s["split"], s.get("how", "")) for s in
                             (r.record.extra.get("selection") for r in group) if s})
        unstated = sum(1 for r in group if not r.record.extra.get("selection"))
        splits = [split for split, _ in selections] + (["not stated"] if unstated else [])
        how = "; ".join(h for _, h in selections if h)
        limits = sorted({n["what"] for n in (r.record.extra.get("not_reproducible") for r in group) if n})
        reproducible = ("not under a fixed seed: " + "; ".join(limits)) if limits else \
            "nothing stated as beyond the seed"
        rows.append([Cell(method), Cell(" / ".join(dict.fromkeys(splits)), strong=len(set(splits)) > 1),
                     Cell(how or "-"), Cell(reproducible, strong=bool(limits))])
        data.append({"method": method, "selected_on": list(dict.fromkeys(splits)), "how": how,
                     "not_reproducible": limits, "runs": len(group)})
    notes = ["As each optimizer stated it in its ledger (its word, not a measurement). \"train\": the final "
             "candidate was chosen on examples the optimizer also learned from, so its val/train score is "
             "optimistic and only the held-out score is a result; \"none\": the seed, unselected."]
    return Table("selection", "How each method chose its final candidate", ["method", "selected on", "how",
                                                                            "reproducibility"], rows, notes, data)


def answer_key_table(runs: RunSet, rows: Sequence[dict[str, Any]]) -> Table:
    """Each final candidate's answer-key share (:func:`heldout.protocols.leakage.answer_key_rows`
    over the report's runs: prompt tasks with training data), so a gain bought with pasted
    training answers is visible beside the scores."""
    label = {(r.record.task, r.record.profile, r.record.method, r.record.seed): r.label for r in runs.runs}
    cells, data = [], []
    for row in rows:
        task = label.get((row["task"], row["profile"], row["method"], row["seed"]), row["task"])
        if row.get("share") is None:
            cells.append([Cell(task), Cell(row["method"]), Cell(str(row["seed"])), Cell("n/a"), Cell("-"),
                          Cell("-"), Cell(f"not scanned: {row.get('problem', '')}")])
        else:
            flags = row["red_flags"]
            cells.append([Cell(task), Cell(row["method"]), Cell(str(row["seed"])), Cell(f"{row['share']:.1%}"),
                          Cell(str(row["encoded"])), Cell(str(row["families"])),
                          Cell(f"RED FLAG: {flags}" if flags else "0", strong=bool(flags))])
        data.append({**row, "task_label": task})
    notes = ["answer-key share: the share of the final candidate's words that are training questions or answers "
             "(leak scan rules: verbatim question runs, answers near their question or their family's words); "
             "encoded: training examples it holds; families: training families (groups) memorised; red flags: "
             "val answers or test/probe data found, which the optimizer never saw (`heldout leak scan` lists them)."]
    return Table("answer_key", "Answer-key share of each final candidate",
                 ["task", "method", "seed", "answer-key share", "encoded", "families", "red flags"], cells, notes, data)


__all__ = ["Cell", "Table", "results_table", "heldout_table", "cost_table", "budget_table", "runs_table",
           "answer_key_table",
           "settings_note", "example_means", "seed_scores", "tokens", "candidate_length", "best_so_far",
           "default_checkpoints", "task_checkpoints", "extraction_modes_table"]
