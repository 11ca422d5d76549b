"""The CI regression gate over run dirs: gather, refuse what cannot be compared, then decide.

This module only reads: run dirs are collected and verified exactly as ``heldout report`` does
(:func:`heldout.reports.collect.collect_runs`), each task's held-out scores become a runs x
examples matrix per side, and the decision is the pure
:func:`heldout.protocols.stats.regression_check` (regression / pass / inconclusive, with the run
as the unit of replication).

Authenticity rule: every run on either side must be authentic (:func:`heldout.evaluators.authenticity.verify_run`)
against the trusted signers given (``trusted``; by default this machine's own signing key), so a
baseline made on one machine and a PR study made on another are checked with public keys alone.
A run that is unsigned, signed by a key not in the list, or tampered is refused (exit 2), one
short line per run naming what was found; with no trusted signer at all nothing is authentic,
and the error says how to name one. A missing key or signature never passes.

Refused with a clear error (exit 2), never silently paired:

* a crashed (failed), interrupted or unverifiable run on either side, or a task present on one
  side only: the study is incomplete;
* a run that is not authentic (see above);
* seeds without a partner when seeds pair by id, or runs whose held-out example sets differ;
* runs whose design differs (``DESIGN_FIELDS``: split profile, budget, visibility policy,
  limits, options, data drift, verifier, models), within a side or between the sides, unless
  that field is named in ``allow_mismatch``; an allowed mismatch is stated in the evidence.

**A fixed candidate is one draw** (rule ``placebo-floor``, as in ``protocol generalisation``). On a
prompt task, a side whose runs all ended on one candidate while the other side's did not has
seeds that replicate nothing: its one score carries its wording's luck, which no seed measures.
When that candidate is the seed (method ``seed``) and the run sets hold ``placebo`` runs of the
task (neutral re-wordings of the seed, :mod:`heldout.protocols.placebo`), those runs stand in for
that side and the runs are compared as independent (the exact permutation test: the current
runs against what re-wording the seed does). Otherwise the task is inconclusive and says why.
Both sides fixed is a fact, not an estimate (the gate's ``_reproducible`` rule); program tasks
keep their seed's one score, whose evaluator a neutral edit does not move.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

import numpy as np

from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import HeldoutError
from heldout.evaluators.authenticity import verify_run
from heldout.evaluators.signing import TrustedSigners
from heldout.protocols.placebo import PLACEBO_METHOD, SEED_METHOD
from heldout.protocols.stats import GateResult, TaskRuns, regression_check
from heldout.protocols.stats.margin import DEFAULT_MARGIN, Margin
from heldout.reports.collect import ReportError, Run, RunSet, collect_runs

SeedPairing = Literal["id", "independent"]
DESIGN_FIELDS = ("profile", "budget", "policy", "limits", "options", "drift", "verifier", "models")
"""What must match for two runs to be comparable. ``verifier`` and ``models`` are read from the
run record (a field of that name, else its ``extra``; absent = None), so records that carry
them are compared on them."""


class GateInputError(ReportError):
    """The run sets cannot be gated as given (incomplete, unpaired or mismatched)."""


@dataclass
class CheckResult:
    """The gate's decision plus everything needed to audit it."""

    gate: GateResult
    pair_seeds: str
    per_task: list[dict[str, Any]]
    statements: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return self.gate.regressed

    @property
    def outcome(self) -> str:
        return self.gate.outcome

    @property
    def exit_code(self) -> int:
        return self.gate.exit_code

    def evidence(self) -> str:
        lines = [self.gate.evidence, "", f"runs (seeds paired {'by id' if self.pair_seeds == 'id' else 'not at all: independent runs'}):"]
        for row in self.per_task:
            lines.append(f"  {row['task']:<36} baseline seeds {row['baseline_seeds']} current seeds {row['current_seeds']} "
                         f"x {row['examples']} example(s)")
        lines += [f"NOTE: {s}" for s in self.statements]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "exit_code": self.exit_code, "regressed": self.regressed,
                "gate": self.gate.as_dict(), "pair_seeds": self.pair_seeds, "per_task": self.per_task,
                "statements": self.statements}


def design_of(run: Run) -> dict[str, str]:
    """The run's design, field by field, as canonical JSON strings."""
    rec = run.record
    extra = rec.extra or {}
    values = {"profile": rec.profile, "budget": rec.budget, "policy": rec.policy, "limits": rec.limits,
              "options": {"task": rec.task_options, "decoding": rec.decoding}, "drift": rec.drift,
              "verifier": getattr(rec, "verifier", None) or extra.get("verifier"),
              "models": getattr(rec, "models", None) or extra.get("models")}
    return {k: json.dumps(v, sort_keys=True, default=str) for k, v in values.items()}


REASON_CHARS = 200  # of each refused run's reason: one short line per run, never pages of them
LISTED_RUNS = 20  # refused runs listed one by one; the rest counted


def _short(text: object, run_dir: Path | None = None) -> str:
    """``text`` on one line, cut to :data:`REASON_CHARS`; the run dir, named before it, is not repeated."""
    line = " ".join(str(text).split())
    if run_dir is not None:
        line = line.replace(f"{run_dir}/", "").replace(str(run_dir), "the run dir")
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 3] + "..."


def _refusal(headline: str, problems: list[str]) -> GateInputError:
    """One error: a headline and one short line per refused run (one line in all for one run)."""
    if len(problems) == 1:
        return GateInputError(f"{headline}: {problems[0]}")
    more = [f"  ... and {len(problems) - LISTED_RUNS} more"] if len(problems) > LISTED_RUNS else []
    return GateInputError("\n".join([f"{headline}: {len(problems)} run(s):", *(f"  {p}" for p in problems[:LISTED_RUNS]),
                                     *more]))


def _refuse_incomplete(side: str, runs: RunSet) -> None:
    problems = [f"{side} run EXCLUDED {e.path}: {_short(e.reason, e.path)}" for e in runs.excluded]
    problems += [f"{side} run FAILED {r.path}: {_short(r.record.error, r.path)}" for r in runs.failed]
    if problems:
        raise _refusal("cannot gate an incomplete study (a crashed, unscored or missing run could hide a "
                       "regression)", problems)


def _refuse_unauthenticated(sides: dict[str, RunSet], trusted: TrustedSigners) -> list[str]:
    """Refuse unless every run is authentic; the signers of the runs, as statements."""
    problems, signers = [], set()
    for side, runs in sides.items():
        for run in runs.runs + runs.failed:
            found = verify_run(run.path, trusted)
            if found.ok:
                signers.add(f"{side}: {found.check.signer}")
            else:
                problems.append(f"{side} run {found.status.value.upper()} {run.path}: "
                                f"{_short(found.check.reason, run.path)}")
    if problems:
        hint = ("; no trusted signer was given and this machine has no signing key: pass --trusted-signers FILE "
                "or --trust-key KEY" if not trusted else f"; trusted signers: {_short(trusted.describe())}")
        raise _refusal("cannot gate runs that are not authentic (unsigned, signed by a key not trusted, or "
                       "tampered)" + hint, problems)
    return [f"runs signed by {', '.join(sorted(signers))}"]


def _by_task(runs: RunSet, method: str | None, side: str) -> dict[str, dict[int, Run]]:
    out: dict[str, dict[str, dict[int, Run]]] = {}
    for (task, name), cell in runs.cells().items():
        if name == PLACEBO_METHOD and method != PLACEBO_METHOD:
            continue  # the noise floor of a fixed candidate (see the module docstring), not a method to gate
        if method is None or name == method:
            out.setdefault(task, {})[name] = cell
    chosen = {}
    for task, methods in out.items():
        if len(methods) > 1:
            raise GateInputError(f"the {side} runs hold several methods for {task} ({', '.join(sorted(methods))}); "
                                 "pass --method to choose the one to compare")
        chosen[task] = next(iter(methods.values()))
    if not chosen:
        raise GateInputError(f"no verified, finished {side} run" + (f" of method {method!r}" if method else ""))
    return chosen


def _check_designs(task: str, base: dict[int, Run], cur: dict[int, Run], allow: set[str]) -> list[str]:
    """Refuse (or, for allowed fields, state) any design field that differs between runs."""
    stated = []
    designs = [("baseline", s, design_of(r)) for s, r in base.items()] + [("current", s, design_of(r)) for s, r in cur.items()]
    for name in DESIGN_FIELDS:
        seen = sorted({d[name] for _, _, d in designs})
        if len(seen) < 2:
            continue
        where = "; ".join(f"{side} seed {s}: {d[name]}" for side, s, d in designs)
        if name not in allow:
            raise GateInputError(f"{task}: runs differ in {name} ({where}); compare matched runs, or pass "
                                 f"--allow-mismatch {name} to compare them anyway")
        stated.append(f"{task}: compared despite different {name} (allowed by --allow-mismatch): {where}")
    return stated


def _matrix(task: str, runs: list[Run], examples: list[str]) -> np.ndarray:
    rows = []
    for run in runs:
        scores = run.test_scores()
        if sorted(scores) != sorted(examples):
            raise GateInputError(f"{task}: run {run.path} scored a different set of held-out examples "
                                 f"({len(scores)} vs {len(examples)}); the sides must share one test set")
        rows.append([scores[e] for e in examples])
    return np.array(rows, dtype=np.float64)


def _placebo_runs(task: str, sides: Sequence[RunSet]) -> list[Run]:
    """The finished placebo runs of ``task`` in either run set."""
    return [run for runs in sides for (label, name), cell in runs.cells().items()
            if label == task and name == PLACEBO_METHOD for run in cell.values()]


def _fixed_candidate(runs: dict[int, Run]) -> bool:
    """Every run (>= 2) ended on the same candidate."""
    return len(runs) >= 2 and len({r.record.final_candidate_id for r in runs.values()}) == 1


def _floor_for(task: str, base: dict[int, Run], cur: dict[int, Run],
               sides: Sequence[RunSet]) -> tuple[str, list[Run]] | None:
    """When one side of a prompt task is a fixed candidate and the other is not: which side, and
    the placebo runs that stand in for it (empty: none can, the task is unreplicated)."""
    fixed = [side for side, runs in (("baseline", base), ("current", cur)) if _fixed_candidate(runs)]
    if len(fixed) != 1 or _kind(task) != "prompt":
        return None
    side = fixed[0]
    runs = base if side == "baseline" else cur
    if next(iter(runs.values())).record.method != SEED_METHOD:
        return side, []
    return side, _placebo_runs(task, sides)


def _kind(task: str) -> str | None:
    """None for a task no longer registered: nothing says a neutral edit would move it."""
    return _registered(task, "kind", str)


def _metric_sign(task: str, runs: list[Run], statements: list[str]) -> int:
    """+1, or -1 for a lower-is-better metric (then stated); runs that disagree on it are refused."""
    specs = {run.metric for run in runs}
    if len(specs) > 1:
        raise GateInputError(f"{task}: runs state different metrics (" + "; ".join(
            sorted(f"{m.name}, {m.direction}" for m in specs)) + "): a cost read as a score turns the gate around")
    metric = specs.pop()
    if not metric.higher_is_better:
        statements.append(f"{task}: {metric.name} is lower-is-better, so the gate reads minus the score: a "
                          "'drop' is a rise in it, and the baseline, change and margin are shown negated")
    return metric.sign


def _ceiling(task: str) -> float | None:
    """None for a task no longer registered: only a headroom margin needs its ceiling, and says so."""
    return _registered(task, "score_ceiling", float)


def _registered(task: str, attribute: str, kind: type) -> Any:
    """``attribute`` of the task's registered benchmark as ``kind``; None when the runs name a task
    this install no longer registers (or one without it): the records alone are still gated."""
    try:
        return kind(getattr(get_benchmark(task), attribute))
    except (HeldoutError, AttributeError, TypeError, ValueError):
        return None


def check_runs(baseline: Iterable[str | Path], current: Iterable[str | Path], *, alpha: float = 0.05,
               min_effect: "float | str | Margin" = DEFAULT_MARGIN, method: str | None = None, pair_seeds: str = "id",
               allow_mismatch: Sequence[str] = (), trusted: TrustedSigners | None = None) -> CheckResult:
    """Compare two run sets; raises :class:`GateInputError` when they cannot be compared. The
    margin is applied per task on its own scale (default :data:`DEFAULT_MARGIN`, 5% of each
    task's baseline score). ``trusted``: whose signatures make a run authentic (default: this
    machine's own signing key)."""
    margin = Margin.parse(min_effect)
    statements: list[str] = []
    if pair_seeds == "rank":
        statements.append("--pair-seeds rank is treated as independent runs: fresh seeds share nothing to pair on")
        pair_seeds = "independent"
    if pair_seeds not in ("id", "independent"):
        raise GateInputError(f"pair_seeds must be 'id' or 'independent', got {pair_seeds!r}")
    unknown = sorted(set(allow_mismatch) - set(DESIGN_FIELDS))
    if unknown:
        raise GateInputError(f"--allow-mismatch knows {', '.join(DESIGN_FIELDS)}; got {', '.join(unknown)}")
    base_runs, cur_runs = collect_runs(list(baseline)), collect_runs(list(current))
    _refuse_incomplete("baseline", base_runs)
    _refuse_incomplete("current", cur_runs)
    statements += _refuse_unauthenticated({"baseline": base_runs, "current": cur_runs},
                                          TrustedSigners.own() if trusted is None else trusted)
    base_cells, cur_cells = _by_task(base_runs, method, "baseline"), _by_task(cur_runs, method, "current")
    only = sorted(set(base_cells) ^ set(cur_cells))
    if only:
        raise GateInputError(f"task(s) in only one run set: {', '.join(only)}; a task the current study dropped "
                             "cannot pass the gate")
    tasks: dict[str, TaskRuns] = {}
    per_task = []
    for task in sorted(base_cells):
        base, cur = base_cells[task], cur_cells[task]
        statements += _check_designs(task, base, cur, set(allow_mismatch))
        if pair_seeds == "id":
            if sorted(base) != sorted(cur):
                raise GateInputError(f"{task}: baseline seeds {sorted(base)} and current seeds {sorted(cur)} do not "
                                     "pair one to one; rerun on the same seeds or pass --pair-seeds independent")
            b_seeds = c_seeds = sorted(base)
        else:
            b_seeds, c_seeds = sorted(base), sorted(cur)
        examples = list(base[b_seeds[0]].test_scores())
        b_runs, c_runs = [base[s] for s in b_seeds], [cur[s] for s in c_seeds]
        paired, unreplicated = pair_seeds == "id", ""
        floor = _floor_for(task, base, cur, (base_runs, cur_runs))
        if floor is not None:
            side, placebo = floor
            what = f"the {side} runs all ended on one candidate of a prompt task: one draw of its wording's luck"
            if placebo:
                statements += _check_designs(task, {r.record.seed: r for r in placebo}, cur if side == "baseline"
                                             else base, set(allow_mismatch))
                b_runs, c_runs = (placebo, c_runs) if side == "baseline" else (b_runs, placebo)
                b_seeds, c_seeds = ([r.record.seed for r in b_runs], [r.record.seed for r in c_runs])
                paired = False
                statements.append(f"{task}: {what}; its {len(placebo)} placebo run(s) (neutral re-wordings of the "
                                  "seed) stand in for it, compared as independent runs (rule placebo-floor)")
            else:
                unreplicated = (f"{what}, and no placebo run of the seed stands in for it: the seeds replicate "
                                "nothing, so the comparison has no noise floor (run method placebo beside the seed, "
                                "or compare runs whose seeds drive the method)")
        tasks[task] = TaskRuns(_matrix(task, b_runs, examples), _matrix(task, c_runs, examples), paired=paired,
                               unreplicated=unreplicated)
        per_task.append({"task": task, "baseline_seeds": b_seeds, "current_seeds": c_seeds, "examples": len(examples)})
    # the gate's rule reads "higher is better": a lower-is-better metric enters it negated, here and only here
    signs = {t: _metric_sign(t, [*base_cells[t].values(), *cur_cells[t].values()], statements) for t in tasks}
    tasks = {t: replace(runs, base=signs[t] * runs.base, cur=signs[t] * runs.cur) for t, runs in tasks.items()}
    gate = regression_check(tasks, alpha=alpha, min_effect=margin, ceilings={t: signs[t] * c for t in tasks
                                                                              if (c := _ceiling(t)) is not None})
    return CheckResult(gate, pair_seeds, per_task, statements)
