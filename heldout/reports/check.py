"""The CI regression gate: did a current run set get worse than a baseline run set?

Pairing: by task, seed and held-out example. Seeds pair by id (``pair_seeds="id"``: seed 0 with
seed 0) or, when the current set was run on fresh seeds, by rank (``"rank"``: the i-th smallest
seed of one side with the i-th of the other). The decision is
:func:`heldout.protocols.stats.regression_check` with one cluster per (task, example), so an
example's seeds move together, and one stratum per task, so every task keeps its weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

import numpy as np

from heldout.protocols.stats import GateResult, regression_check
from heldout.reports.collect import ReportError, Run, RunSet, collect_runs

SeedPairing = Literal["id", "rank"]


@dataclass
class CheckResult:
    """The gate's decision plus everything needed to audit it."""

    gate: GateResult
    pair_seeds: str
    per_task: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return self.gate.regressed

    def evidence(self) -> str:
        lines = [self.gate.evidence, "", f"paired by task, held-out example and seed ({self.pair_seeds}):"]
        lines.append(f"  {'task':<36} {'seeds (baseline->current)':<28} {'examples':>8} {'baseline':>9} "
                     f"{'current':>9} {'change':>9}")
        for row in self.per_task:
            seeds = ",".join(f"{a}->{b}" for a, b in row["seed_pairs"])
            lines.append(f"  {row['task']:<36} {seeds:<28} {row['examples']:>8} {row['baseline']:>9.4f} "
                         f"{row['current']:>9.4f} {row['change']:>+9.4f}")
        lines += [f"WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"regressed": self.regressed, "gate": self.gate.as_dict(), "pair_seeds": self.pair_seeds,
                "per_task": self.per_task, "warnings": self.warnings}


def _by_task(runs: RunSet, method: str | None, side: str) -> dict[str, dict[int, Run]]:
    out: dict[str, dict[str, dict[int, Run]]] = {}
    for (task, name), cell in runs.cells().items():
        if method is None or name == method:
            out.setdefault(task, {})[name] = cell
    chosen = {}
    for task, methods in out.items():
        if len(methods) > 1:
            raise ReportError(f"the {side} runs hold several methods for {task} ({', '.join(sorted(methods))}); "
                              "pass --method to choose the one to compare")
        chosen[task] = next(iter(methods.values()))
    if not chosen:
        raise ReportError(f"no verified, finished {side} run" + (f" of method {method!r}" if method else ""))
    return chosen


def _seed_pairs(base: dict[int, Run], cur: dict[int, Run], how: SeedPairing, task: str) -> list[tuple[int, int]]:
    if how == "rank":
        return list(zip(sorted(base), sorted(cur)))
    common = sorted(set(base) & set(cur))
    if not common:
        raise ReportError(f"{task}: baseline seeds {sorted(base)} and current seeds {sorted(cur)} share none; "
                          "rerun on the same seeds or pass --pair-seeds rank")
    return [(s, s) for s in common]


def check_runs(baseline: Iterable[str | Path], current: Iterable[str | Path], *, alpha: float = 0.05,
               min_effect: float = 0.0, method: str | None = None, pair_seeds: SeedPairing = "id",
               n_flips: int = 10_000, n_boot: int = 10_000) -> CheckResult:
    """Compare two run sets. Raises :class:`ReportError` when nothing can be paired."""
    if pair_seeds not in ("id", "rank"):
        raise ReportError(f"pair_seeds must be 'id' or 'rank', got {pair_seeds!r}")
    base_runs, cur_runs = collect_runs(list(baseline)), collect_runs(list(current))
    warnings = [f"{side} run EXCLUDED {e.path}: {e.reason}"
                for side, rs in (("baseline", base_runs), ("current", cur_runs)) for e in rs.excluded]
    warnings += [f"{side} run FAILED {r.path}: {r.record.error}"
                 for side, rs in (("baseline", base_runs), ("current", cur_runs)) for r in rs.failed]
    base_cells, cur_cells = _by_task(base_runs, method, "baseline"), _by_task(cur_runs, method, "current")
    only = sorted(set(base_cells) ^ set(cur_cells))
    if only:
        warnings.append(f"task(s) in only one run set, not compared: {', '.join(only)}")
    b_scores, c_scores, clusters, strata, per_task = [], [], [], [], []
    for task in sorted(set(base_cells) & set(cur_cells)):
        base, cur = base_cells[task], cur_cells[task]
        pairs = _seed_pairs(base, cur, pair_seeds, task)
        unpaired = sorted(set(base) - {a for a, _ in pairs}) + sorted(set(cur) - {b for _, b in pairs})
        if unpaired:
            warnings.append(f"{task}: seed(s) {unpaired} have no partner and are left out")
        task_b, task_c, examples = [], [], set()
        for b_seed, c_seed in pairs:
            b_ex, c_ex = base[b_seed].test_scores(), cur[c_seed].test_scores()
            shared = [e for e in b_ex if e in c_ex]
            if len(shared) < max(len(b_ex), len(c_ex)):
                warnings.append(f"{task} seeds {b_seed}->{c_seed}: {max(len(b_ex), len(c_ex)) - len(shared)} "
                                "held-out example(s) scored on one side only are left out")
            for ex in shared:
                task_b.append(b_ex[ex])
                task_c.append(c_ex[ex])
                clusters.append((task, ex))
                strata.append(task)
                examples.add(ex)
        b_scores += task_b
        c_scores += task_c
        if task_b:
            per_task.append({"task": task, "seed_pairs": pairs, "examples": len(examples),
                             "pairs": len(task_b), "baseline": float(np.mean(task_b)),
                             "current": float(np.mean(task_c)), "change": float(np.mean(task_c) - np.mean(task_b))})
    if not b_scores:
        raise ReportError("the baseline and current runs share no (task, seed, example) to pair")
    gate = regression_check(b_scores, c_scores, alpha=alpha, min_effect=min_effect, clusters=clusters,
                            strata=strata, n_flips=n_flips, n_boot=n_boot)
    return CheckResult(gate, pair_seeds, per_task, warnings)
