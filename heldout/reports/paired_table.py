"""The held-out paired table: per task, each method against the baseline with the run as the unit.

Columns: interval, test p and run-to-run SD over runs; per-example columns (Wilcoxon p, dz,
win/tie/loss); Holm and Benjamini-Hochberg p across tasks; and a verdict that says "cannot
separate" (and how many seeds would) when it can't. Every "better", "worse", win and loss reads
the task's metric direction (:class:`heldout.contracts.MetricSpec`, as its runs recorded it);
the numbers stay in the metric's own units (change = method - baseline).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from heldout.contracts import MetricSpec
from heldout.protocols.decide import Contrast, beyond_placebo
from heldout.protocols.placebo import PLACEBO_METHOD, stratum
from heldout.protocols.stats import correct_pvalues, paired_comparison, separates
from heldout.protocols.stats.runs import run_verdict
from heldout.reports.collect import Run, RunSet
from heldout.reports.tables import Cell, Table, decimals, example_means, fmt, fmt_p, seed_scores, settings_note

Cellset = dict[int, Run]


def heldout_table(runs: RunSet, baseline: str, *, alpha: float = 0.05, n_boot: int = 10_000) -> Table:
    cells = runs.cells()
    tasks, methods = runs.tasks(), [m for m in runs.methods() if m not in (baseline, PLACEBO_METHOD)]
    columns = ["task", "method", "n", "seeds", f"{baseline}", "method mean", "mean change", f"{(1 - alpha):.0%} CI",
               "run SD", "test p", "Wilcoxon p", "dz", "W/T/L", "Holm p", "BH p", "verdict"]
    comparisons: dict[tuple[str, str], dict[str, Any]] = {}
    for task in tasks:
        if (task, baseline) not in cells:
            continue
        metric = runs.metric(task)
        for method in methods:
            if (task, method) in cells:
                info = _compare(cells, task, (baseline, method), metric, alpha=alpha, n_boot=n_boot)
                if info is not None:
                    comparisons[(task, method)] = info
    corrected = _corrections(comparisons, methods, alpha)
    rows, data, reasons = [], [], []
    for (task, method), info in sorted(comparisons.items()):
        verdict = _verdict(info, corrected[(task, method)], method, alpha)
        rows.append(_row(task, method, info, corrected[(task, method)], verdict))
        reasons.append(f"{task}, {method}: {verdict}")
        data.append(_data(task, method, baseline, info, corrected[(task, method)], verdict))
    notes = _notes(runs, baseline, alpha) + reasons
    costs = sorted({task for (task, _), info in comparisons.items() if not info["metric"].higher_is_better})
    if costs:
        notes.append("Lower is better on " + ", ".join(costs) + ": there a negative change is the improvement, "
                     "and wins, 'better' and 'worse' are read that way (the metric each run recorded).")
    dropped = sum(info["dropped"] for info in comparisons.values())
    if dropped:
        notes.append(f"{dropped} held-out example(s) were scored by only one arm and left out of the pairing.")
    if not any((t, baseline) in cells for t in tasks):
        notes.append(f"No runs of the baseline method {baseline!r}: nothing to pair against "
                     f"(methods present: {', '.join(runs.methods())}).")
    return Table("heldout", f"Held-out paired comparison against {baseline}", columns, rows, notes, data)


def _paired_values(base_cell: Cellset, cell: Cellset) -> tuple[dict[Any, float], dict[Any, float], str, int]:
    """Per-example means over each cell's seeds, paired by example; a single-instance task (one
    held-out example) pairs seeds instead: the seeds are its replicates."""
    b_vals, m_vals = example_means(base_cell), example_means(cell)
    n_examples = len([ex for ex in b_vals if ex in m_vals])
    if n_examples >= 2:
        return b_vals, m_vals, "examples", n_examples
    return ({s: float(r.record.test_score or 0.0) for s, r in base_cell.items()},
            {s: float(r.record.test_score or 0.0) for s, r in cell.items()}, "seeds", n_examples)


def _compare(cells: dict[tuple[str, str], Cellset], task: str, labels: tuple[str, str], metric: MetricSpec, *,
             alpha: float, n_boot: int) -> dict[str, Any] | None:
    """One (task, method) comparison with everything its row, verdict and data need."""
    baseline, method = labels
    base_cell, cell = cells[(task, baseline)], cells[(task, method)]
    b_vals, m_vals, unit, n_examples = _paired_values(base_cell, cell)
    shared = [key for key in b_vals if key in m_vals]
    if not shared:
        return None
    result = paired_comparison([b_vals[k] for k in shared], [m_vals[k] for k in shared], n_boot=n_boot,
                               ci=1 - alpha, labels=labels, higher_is_better=metric.higher_is_better)
    # The conclusion: runs are the unit (per-run scores on the shared examples, an exact
    # permutation test over runs); with one run per arm only the per-example view.
    ids = [ex for ex in b_vals if ex in m_vals] if unit == "examples" else None

    def per_run(c: Cellset) -> list[float]:
        return [float(np.mean([scores[e] for e in ids])) if ids else float(r.record.test_score or 0.0)
                for r in c.values() for scores in (r.test_scores(),)]

    runs_level = floor = None
    if min(len(cell), len(base_cell)) >= 2 and n_examples >= 1:
        runs_level = run_verdict(per_run(base_cell), per_run(cell), n_examples=max(1, n_examples), alpha=alpha,
                                 labels=labels, higher_is_better=metric.higher_is_better)
        if baseline == "seed":
            floor = _placebo_floor(cells.get((task, PLACEBO_METHOD)), cell, per_run, alpha, labels)
    return {"result": result, "seeds": (len(base_cell), len(cell)), "unit": unit, "runs": runs_level,
            "floor": floor, "metric": metric,
            "dropped": len(set(b_vals) ^ set(m_vals)) if unit == "examples" else 0,
            "seeds_separate": separates(seed_scores(cell), seed_scores(base_cell)),
            "enough_seeds": min(len(cell), len(base_cell)) >= 2}


def _corrections(comparisons: dict[tuple[str, str], dict[str, Any]], methods: list[str],
                 alpha: float) -> dict[tuple[str, str], dict[str, Any]]:
    """Holm and Benjamini-Hochberg over the tasks of each method."""
    corrected: dict[tuple[str, str], dict[str, Any]] = {}
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
    return corrected


def _row(task: str, method: str, info: dict[str, Any], corr: dict[str, Any], verdict: str) -> list[Cell]:
    res, rl = info["result"], info["runs"]
    d = decimals([res.mean_a, res.mean_b, res.mean_diff])
    low, high = (rl.comparison.low, rl.comparison.high) if rl else (res.ci_low, res.ci_high)
    if info["floor"] is not None:
        low, high = info["floor"].low, info["floor"].high
    run_sd = (f"{fmt(rl.comparison.run_sd_base, d)}/{fmt(rl.comparison.run_sd_cur, d)}" if rl else "n/a (1 run)")
    return [Cell(task), Cell(method), Cell(f"{res.n} {info['unit']}"), Cell(f"{info['seeds'][0]}/{info['seeds'][1]}"),
            Cell(fmt(res.mean_a, d)), Cell(fmt(res.mean_b, d)), Cell(f"{res.mean_diff:+.{d}f}"),
            Cell(f"[{low:+.{d}f}, {high:+.{d}f}]" if math.isfinite(low) and math.isfinite(high) else "n/a"),
            Cell(run_sd), Cell(fmt_p(_test_p(info))), Cell(fmt_p(res.wilcoxon_p)), Cell(fmt(res.dz, 2)),
            Cell(f"{res.wins}/{res.ties}/{res.losses}"), Cell(fmt_p(corr["holm"])), Cell(fmt_p(corr["fdr_bh"])),
            # the cell holds the short verdict; its reasoning goes below the table
            Cell(verdict.split(":", 1)[0], strong=not verdict.startswith("cannot separate"))]


def _data(task: str, method: str, baseline: str, info: dict[str, Any], corr: dict[str, Any],
          verdict: str) -> dict[str, Any]:
    rl, floor, metric = info["runs"], info["floor"], info["metric"]
    return {"task": task, "method": method, "baseline": baseline, "unit": info["unit"], **info["result"].as_dict(),
            **(rl.as_dict() if rl else {"run_level": None}),
            "placebo_floor": floor.as_dict() if floor is not None else None,
            "metric": metric.name, "higher_is_better": metric.higher_is_better,
            "seeds_baseline": info["seeds"][0], "seeds_method": info["seeds"][1],
            "examples_unpaired": info["dropped"], "seed_ranges_separate": info["seeds_separate"],
            "p_holm": corr["holm"], "p_fdr_bh": corr["fdr_bh"], "report_verdict": verdict}


def _notes(runs: RunSet, baseline: str, alpha: float) -> list[str]:
    return [settings_note(runs),
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


def _placebo_floor(placebo_cell: Cellset | None, cell: Cellset, per_run, alpha: float,
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


def _verdict(info: dict[str, Any], corr: dict[str, Any], method: str, alpha: float) -> str:
    res, floor, metric = info["result"], info.get("floor"), info["metric"]
    if floor is not None:
        reading = floor.sentence.split(": ", 1)[1]
        if floor.decided and not corr["holm_reject"]:
            return f"cannot separate after Holm correction (p={corr['holm']:.3g} >= {alpha:g}); " + reading
        if floor.decided:  # the rule says higher or lower; the metric says which of them is better
            better = (floor.sign == "+") == metric.higher_is_better
            return f"{method} is {'better' if better else 'worse'} ({metric.direction}): {reading}"
        return reading
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


__all__ = ["heldout_table"]
