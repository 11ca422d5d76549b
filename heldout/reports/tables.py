"""The report's tables, computed from verified runs with :mod:`heldout.protocols.stats`.

* :func:`results_table`  - Table 1: task x method, mean +/- std of the held-out score over seeds,
  best marked, n seeds, macro mean and win counts against the baseline;
* the held-out paired table lives in :mod:`heldout.reports.paired_table`;
* :func:`cost_table`     - optimisation tokens (worker-optimisation + architect + judge-optimisation),
  deployment tokens (worker- and judge-deployment), the judge's share, candidate length, held-out
  gain per million optimisation tokens;
* :func:`budget_table`   - best-so-far (optimizer-visible score) at metric-call checkpoints.

Rule: every table carries the settings it was computed under (split profile, visibility policy,
budget, tolerance, drift override, the metric and its direction) in its notes; mixed settings are flagged, not hidden.

Direction rule: "best", wins and gains read each task's metric as its runs recorded it
(:meth:`heldout.reports.collect.RunSet.metric`): on a lower-is-better task the best is the
lowest mean and a gain is a drop; scores are always shown in the metric's own units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from heldout.benchmarks.extraction import EXTRACTION_MODES, HEADLINE_MODE
from heldout.contracts import MetricSpec
from heldout.protocols.stats import macro_mean, macro_mean_interval, summarize_seeds, win_counts
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
              "verifier": "verifier", "prompt setting": "prompt setting", "metric": "metric"}
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


def task_scale(runs: RunSet, task: str) -> tuple[MetricSpec | None, float | None]:
    """(metric, score ceiling) of a task label's runs, from their experiment descriptions
    ((None, None) for runs that predate them, or when runs disagree)."""
    seen = {(MetricSpec.from_record(r.record.experiment) if r.record.experiment.get("metric") else None,
             r.record.experiment.get("score_ceiling")) for r in runs.runs if r.label == task}
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


def _strong_best(scores: dict[str, list[float]], n_examples: int,
                 metric: MetricSpec) -> tuple[str | None, bool, str | None]:
    """The method with the best mean in the metric's direction, whether its seeds separate it
    from the runner-up (the run-level test of :func:`heldout.protocols.stats.runs.run_verdict`;
    never ranges alone), and that test's name (None when no test ran: one method, or a side with
    < 2 seeds)."""
    if not scores:
        return None, False, None
    ranked = sorted(scores, key=lambda m: float(np.mean(scores[m])), reverse=metric.higher_is_better)
    if len(ranked) == 1 or min(len(scores[ranked[0]]), len(scores[ranked[1]])) < 2:
        return ranked[0], False, None
    verdict = run_verdict(scores[ranked[1]], scores[ranked[0]], n_examples=max(1, n_examples),
                          higher_is_better=metric.higher_is_better)
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
        row, cell_data, test = _score_row(runs, cells, task, methods)
        rows.append(row)
        data += cell_data
        tests_used.append(test)
    complete = [m for m in methods if all((t, m) in cells for t in tasks)]
    costs = [t for t in tasks if not runs.metric(t).higher_is_better]
    notes = [settings_note(runs),
             "Held-out (test) score, mean ± std over seeds (std with ddof=1; n = seeds). Bold: best mean "
             "per task (the highest; the lowest where lower is better" + (f": {', '.join(costs)}" if costs else "")
             + "); " + dagger_legend(tests_used)]
    if runs.excluded:
        notes.append("‡ seeds of this cell that have no score (incomplete: the infrastructure failed; interrupted; or "
                     "not verified): the mean is over the seeds that have one; see the warnings above.")
    if len(tasks) > 1 and complete:
        macro_rows, macro_data, macro_notes = _macro_rows(runs, cells, tasks, methods, complete)
        rows += macro_rows
        data += macro_data
        notes += macro_notes
    if baseline and baseline in methods and len(methods) > 1 and complete and baseline in complete:
        rows.append(_wins_row(runs, cells, tasks, methods, complete, baseline))
        notes.append("wins/ties/losses compare means over seeds per task in each task's metric direction (a lower "
                     "cost is a win); 'sep.' counts only tasks where the seeds separate the two (exact permutation "
                     "over seeds, Holm over the tasks at 0.05): separated wins / separated losses.")
    return Table("results", "Table 1: held-out score by task and method", ["task"] + methods, rows, notes, data)


def _score_row(runs: RunSet, cells: dict[tuple[str, str], dict[int, Run]], task: str,
               methods: list[str]) -> tuple[list[Cell], list[dict[str, Any]], str | None]:
    """One task's row of Table 1, its cells' data, and the test that marked its best."""
    scores = {m: seed_scores(cells[(task, m)]) for m in methods if (task, m) in cells}
    best, separated, test = _strong_best(scores, _examples_per_run(cells, task, methods), runs.metric(task))
    row, data = [Cell(task)], []
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
    return row, data, test


def _macro_rows(runs: RunSet, cells: dict[tuple[str, str], dict[int, Run]], tasks: list[str], methods: list[str],
                complete: list[str]) -> tuple[list[list[Cell]], list[dict[str, Any]], list[str]]:
    """The macro-mean row, only over one scale: the same metric (direction included) and ceiling,
    or each higher-is-better task's score divided by its ceiling; never 2.54, 0.0028 and 0.5
    averaged as they are, and never a cost averaged with an accuracy."""
    scales = {t: task_scale(runs, t) for t in tasks}
    same = len(set(scales.values())) == 1 and None not in next(iter(scales.values()))
    normalise = not same and all(s[1] and s[0] is not None and s[0].higher_is_better for s in scales.values())
    if not (same or normalise):
        return [], [], ["No macro mean: the tasks score on different scales or directions and not every task states "
                        "a ceiling to normalise by (" + "; ".join(
                            f"{t}: {s[0].name + ', ' + s[0].direction if s[0] else None}" for t, s in scales.items())
                        + ")."]
    div = {t: float(scales[t][1]) if normalise else 1.0 for t in tasks}
    per_run = {m: {t: [s / div[t] for s in seed_scores(cells[(t, m)])] for t in tasks} for m in complete}
    macro = {m: macro_mean({t: float(np.mean(v)) for t, v in per_run[m].items()}) for m in complete}
    spread = {m: macro_mean_interval(per_run[m], ci=0.95) for m in complete}
    d = decimals(list(macro.values()))
    label = "macro mean of score / task ceiling" if normalise else "macro mean"
    row = [Cell(label)] + [Cell(fmt(macro[m], d) + _interval_text(spread[m], d)) if m in macro else Cell("-")
                           for m in methods]
    data = [{"task": label, "method": m, "mean": macro[m], "interval": spread[m].as_dict()} for m in complete]
    notes = ["Macro mean: unweighted over tasks, with a 95% interval over tasks and runs (two-level "
             "bootstrap with >= 5 tasks and >= 5 runs, else a t interval over runs with the tasks fixed; "
             "docs/statistics.md)."]
    if normalise:
        notes.append("The tasks score on different scales, so the macro mean averages each task's score "
                     "divided by its ceiling (the reference or best possible score): " + "; ".join(
                         f"{t}: {scales[t][1]:.6g}" for t in tasks) + ".")
    return [row], data, notes


def _wins_row(runs: RunSet, cells: dict[tuple[str, str], dict[int, Run]], tasks: list[str], methods: list[str],
              complete: list[str], baseline: str) -> list[Cell]:
    """Wins/ties/losses against the baseline; each task's scores enter oriented by its metric
    (a cost negated), so a win is always an improvement; the counts show no score."""
    sign = {t: runs.metric(t).sign for t in tasks}
    table = {m: {t: [sign[t] * v for v in seed_scores(cells[(t, m)])] for t in tasks} for m in complete}
    counts = win_counts(table, [baseline], n_examples={t: _examples_per_run(cells, t, complete) for t in tasks})
    return [Cell(f"wins/ties/losses vs {baseline}")] + [
        Cell(next((f"{c.wins}/{c.ties}/{c.losses} (sep. {c.separated_wins}/{c.separated_losses})"
                   for c in counts if c.method == m), "-")) for m in methods]


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
            # a gain is an improvement in the metric's direction (a drop in a cost)
            change = float(np.mean(seed_scores(cell)) - np.mean(seed_scores(cells[(task, baseline)])))
            gain = runs.metric(task).sign * change
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
             f"Gain = mean held-out score minus {baseline or 'the baseline'}'s (the reverse where lower is better: "
             "a gain is always an improvement); per 1M optimisation tokens. "
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
    """Each final candidate's answer-key share (:func:`heldout.protocols.leak_scan.answer_key_rows`
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


__all__ = ["Cell", "Table", "results_table", "cost_table", "budget_table", "runs_table",
           "answer_key_table",
           "settings_note", "example_means", "seed_scores", "tokens", "candidate_length", "best_so_far",
           "default_checkpoints", "task_checkpoints", "extraction_modes_table"]
