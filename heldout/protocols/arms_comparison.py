"""Reading an arms run dir back (:func:`compare_arms`; the overview is
:mod:`heldout.protocols.arms`): every planned run's finished record and verified ledger, the spend
per seed and arm in every unit, the fork arm's selected and oracle forks, the three seed-paired
verdicts (Holm across them), the confounds in the units not held fixed, the merge mechanism's
flags, what broke, and the conclusion. :func:`arms_table` is the report's hook."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from heldout.contracts import MetricSpec
from heldout.evaluators.ledger import LEDGER_FILE, read_entries, verify_ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.files import read_user_json
from heldout.protocols import decide
from heldout.protocols.arms_plan import (ARMS_FILE, FIXED_UNITS, ArmsError, ArmsSpec, Headroom, PlannedRun,
                                         plan_arms)

MERGE_EVENTS = ("merge_attempt", "union_built", "contested", "merge_round")


@dataclass
class RunSpend:
    """What one run spent, counted from its ledger."""

    metric_calls: int = 0
    architect_calls: int = 0
    tokens: int = 0

    def get(self, unit: str) -> int:
        return getattr(self, unit)


@dataclass
class ArmResult:
    """One arm: per-seed held-out scores (for the fork arm, the selected and oracle forks), spend
    per seed in every unit, and the mechanism evidence from its ledgers."""

    arm: str
    runs: int = 0
    test: dict[int, float] = field(default_factory=dict)
    oracle: dict[int, float] = field(default_factory=dict)
    selected_fork: dict[int, int] = field(default_factory=dict)
    spend: dict[int, RunSpend] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    unions_accepted: int = 0
    parts_max: int | None = None
    final_components: int | None = None
    selection_split: str | None = None
    stop_reasons: dict[int, list[str]] = field(default_factory=dict)

    def total(self, unit: str) -> int:
        return sum(s.get(unit) for s in self.spend.values())


def ledger_spend_and_events(run_dir: Path) -> tuple[RunSpend, list[dict[str, Any]]]:
    entries, _ = read_entries(run_dir / LEDGER_FILE)
    spend = RunSpend()
    events = []
    for entry in entries:
        data = entry["data"]
        if entry["kind"] == "evaluation":
            spend.metric_calls += int(data.get("cost", 1))
        elif entry["kind"] == "architect_call":
            spend.architect_calls += 1
            spend.tokens += int(data["prompt_tokens"]) + int(data["completion_tokens"])
        elif entry["kind"] == "optimizer_event":
            events.append(data)
    return spend, events


def _train_mean(record: RunRecord) -> float:
    for node in record.lineage:
        if node["candidate_id"] == record.final_candidate_id:
            return float(node["means"].get("train", float("-inf")))
    return float("-inf")


@dataclass
class ArmsComparison:
    """The result: per arm scores, spend, confounds, separation, mechanism, and what broke."""

    spec: ArmsSpec
    arms: dict[str, ArmResult]
    headroom: Headroom | None
    broken: list[str]
    comparisons: list[decide.Contrast]
    flags: list[str]
    conclusion: str
    stopped: list[str] = field(default_factory=list)

    # rows: one per reported arm (the fork arm twice)
    def rows(self) -> list[dict[str, Any]]:
        serial, fork, merge = self.spec.arm_names
        rows = []
        for label, arm, scores in ((serial, serial, self.arms[serial].test),
                                   (f"{fork} (selected)", fork, self.arms[fork].test),
                                   (f"{fork} (oracle)", fork, self.arms[fork].oracle),
                                   (merge, merge, self.arms[merge].test)):
            result = self.arms[arm]
            values = [scores[s] for s in sorted(scores)]
            rows.append({
                "arm": label, "seeds": len(values),
                "min": min(values) if values else None,
                "median": statistics.median(values) if values else None,
                "max": max(values) if values else None,
                "per_seed": {str(s): scores[s] for s in sorted(scores)},
                **{f"spent_{u}": result.total(u) for u in FIXED_UNITS},
                "merge_rounds": result.events.get("merge_attempt", 0),
                "unions_built": result.events.get("union_built", 0),
                "unions_accepted": result.unions_accepted,
                "contested": result.events.get("contested", 0),
                "shippable": not label.endswith("(oracle)"),
            })
        return rows

    def confounds(self) -> list[str]:
        """The units not held fixed, arm against arm (e.g. "merge-of-4 spent 73 architect calls
        vs fork-of-4 132")."""
        serial, fork, merge = self.spec.arm_names
        out = []
        for unit in FIXED_UNITS:
            if unit == self.spec.fixed:
                continue
            totals = {a: self.arms[a].total(unit) for a in self.spec.arm_names}
            if not any(totals.values()):
                continue
            word = unit.replace("_", " ") if unit != "tokens" else "architect tokens"
            out.append(f"{merge} spent {totals[merge]} {word} vs {fork} {totals[fork]} vs {serial} {totals[serial]}")
        return out

    def text(self) -> str:
        spec = self.spec
        lines = [f"arms: {spec.task} [{spec.profile}], {spec.optimizer}, width {spec.width}, "
                 f"{spec.budget} {spec.fixed} per seed and arm (fixed), seeds {','.join(map(str, spec.seeds))}"]
        if self.headroom is not None:
            lines.append(self.headroom.describe())
        lines.append(f"{'arm':<26} {'seeds':>5} {'min':>8} {'median':>8} {'max':>8} {'spent ' + spec.fixed:>20}"
                     f" {'rounds':>7} {'unions':>7} {'accepted':>8} {'contested':>9}")
        for row in self.rows():
            def num(v):
                return "-" if v is None else f"{v:.4g}"
            lines.append(f"{row['arm']:<26} {row['seeds']:>5} {num(row['min']):>8} {num(row['median']):>8} "
                         f"{num(row['max']):>8} {row['spent_' + spec.fixed]:>20} {row['merge_rounds']:>7} "
                         f"{row['unions_built']:>7} {row['unions_accepted']:>8} {row['contested']:>9}")
        fork = self.arms[spec.arm_names[1]]
        if fork.selection_split:
            lines.append(f"the selected fork is the best on {fork.selection_split} (shippable); the oracle fork is "
                         "the best on test (an upper bound nobody can ship)")
        for line in self.confounds():
            lines.append(f"confound: {line}")
        for note in self.stopped:
            lines.append(f"stopped by itself: {note}")
        for c in self.comparisons:
            lines.append(c.sentence)
        for flag in self.flags:
            lines.append(f"FLAG: {flag}")
        for problem in self.broken:
            lines.append(f"BROKEN: {problem}")
        lines.append(f"conclusion: {self.conclusion}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "rows": self.rows(), "confounds": self.confounds(),
                "comparisons": [c.as_dict() for c in self.comparisons], "stopped": self.stopped,
                "flags": self.flags, "broken": self.broken, "conclusion": self.conclusion,
                "headroom": None if self.headroom is None else {**asdict(self.headroom),
                                                                "little": self.headroom.little}}


def compare_arms(run_dir: str | Path, alpha: float = 0.05) -> ArmsComparison:
    """Read an arms run dir back (ledgers first) and compare. Never raises for a broken
    comparison: ``broken`` says what is wrong."""
    root = Path(run_dir)
    path = root / ARMS_FILE
    if not path.is_file():
        raise ArmsError(f"{run_dir} holds no {ARMS_FILE}: not an arms run dir (run `heldout compare arms`)")
    stored = read_user_json(path, "arms experiment", error=ArmsError)
    spec = ArmsSpec.from_dict(stored["spec"])
    headroom = Headroom(**stored["headroom"]) if stored.get("headroom") else None
    plan = plan_arms(spec, root)
    serial, fork, merge = spec.arm_names
    arms = {a: ArmResult(a) for a in spec.arm_names}
    broken: list[str] = []
    forks: dict[int, list[tuple[int, RunRecord]]] = {}
    n_examples = 0
    metric = MetricSpec("score")  # until a finished record states the task's
    for run in plan:
        record = _read_run(spec, run, arms[run.arm], broken)
        if record is None:
            continue
        metric = MetricSpec.from_record(record.experiment)  # every run is of spec.task: one metric
        n_examples = len(record.test_verdicts)
        if run.fork is None:
            arms[run.arm].test[run.seed] = float(record.test_score)
            arms[run.arm].final_components = len(record.final_candidate or {})
        else:
            forks.setdefault(run.seed, []).append((run.fork, record))
    _select_forks(spec, arms[fork], forks, metric)
    unspent, problems = _underspend(spec, plan, arms)
    broken += problems
    flags = _mechanism_flags(spec, arms[merge])
    pairs = [(b if b != fork else f"{fork} (selected)", a, arms[b].test, arms[a].test)
             for a, b in ((merge, fork), (merge, serial), (serial, fork))]
    comparisons = decide.family(pairs, n_examples=max(n_examples, 1), paired=True, alpha=alpha)
    conclusion = _conclude(spec, arms, comparisons, flags, broken, metric.higher_is_better)
    return ArmsComparison(spec, arms, headroom, broken, comparisons, flags, conclusion, unspent)


def _read_run(spec: ArmsSpec, run: PlannedRun, result: ArmResult, broken: list[str]) -> RunRecord | None:
    """One planned run's finished record, its spend counted from its verified ledger into its arm's
    ``result`` and its merge events tallied; None (and why, in ``broken``) when it did not finish
    ``ok`` with a held-out score or its ledger does not verify."""
    where = run.run_dir
    if not (where / RECORD_FILE).is_file():
        broken.append(f"{run.arm} seed {run.seed}{'' if run.fork is None else f' fork {run.fork}'}: "
                      f"no finished run at {where}")
        return None
    ledger = verify_ledger(where)
    if not ledger.ok:
        broken.append(f"{where}: ledger does not verify ({'; '.join(ledger.problems[:2])})")
        return None
    record = RunRecord.load(where)
    if record.status != "ok" or record.test_score is None:
        broken.append(f"{where}: the run {record.status}: {record.error}")
        return None
    spend, events = ledger_spend_and_events(where)
    allowed = (record.budget or {}).get("metric_calls")
    if allowed is not None and allowed != run.metric_calls:
        broken.append(f"{where}: allowed {allowed} metric_calls, the plan {run.metric_calls}")
    if spend.metric_calls != record.usage["metric_calls"]:
        broken.append(f"{where}: the record says {record.usage['metric_calls']} metric calls, "
                      f"the ledger {spend.metric_calls}")
    limit = run.limit(spec.fixed)
    if limit is not None and spec.fixed != "tokens" and spend.get(spec.fixed) > limit:
        broken.append(f"{where}: spent {spend.get(spec.fixed)} {spec.fixed} over its limit {limit}")
    result.runs += 1
    total = result.spend.setdefault(run.seed, RunSpend())
    for unit in FIXED_UNITS:
        setattr(total, unit, total.get(unit) + spend.get(unit))
    result.stop_reasons.setdefault(run.seed, []).extend(
        str(e.get("data", {}).get("reason", "")) for e in events if e.get("kind") == "stopped")
    for event in events:
        kind = event.get("kind")
        if kind in MERGE_EVENTS:
            result.events[kind] = result.events.get(kind, 0) + 1
        data = event.get("data", {})
        if kind == "merge_round" and data.get("chosen") == "union":
            result.unions_accepted += 1
        if isinstance(data.get("parts_total"), int):
            result.parts_max = max(result.parts_max or 0, data["parts_total"])
    return record


def _select_forks(spec: ArmsSpec, fork_result: ArmResult, forks: dict[int, list[tuple[int, RunRecord]]],
                  metric: MetricSpec) -> None:
    """Per seed with every fork finished: the selected fork (the best on val, train without one, in
    the metric's direction) and the oracle fork (the best on test: an upper bound nobody can ship)."""
    for seed, members in forks.items():
        if len(members) != spec.width:
            continue  # the missing fork is already listed as broken
        use_val = all(r.val_score is not None for _, r in members)
        fork_result.selection_split = "val" if use_val else "train (the task has no val split)"
        key = (lambda r: r.val_score) if use_val else _train_mean
        # the best in the metric's direction (a lower cost), ties to the lowest fork
        chosen_k, chosen = min(members, key=lambda kr: (-metric.sign * key(kr[1]), kr[0]))
        fork_result.selected_fork[seed] = chosen_k
        fork_result.test[seed] = float(chosen.test_score)
        fork_result.oracle[seed] = metric.sign * max(metric.sign * float(r.test_score) for _, r in members)


def _underspend(spec: ArmsSpec, plan: Sequence[PlannedRun], arms: dict[str, ArmResult]) -> tuple[list[str], list[str]]:
    """``(stopped, broken)``: per seed, each arm's spend in the fixed unit against the largest
    arm's. Spending less than allowed is the optimizer's choice (it converged, or could not pay
    for one more evaluation), reported with its reason; no arm spending the fixed unit at all
    means the unit held nothing fixed, which is broken."""
    unit = spec.fixed
    if all(a.total(unit) == 0 for a in arms.values()) and any(a.runs for a in arms.values()):
        return [], [f"no arm spent any {unit}: the fixed unit held nothing fixed (does the optimizer use it?)"]
    allowed: dict[tuple[str, int], int] = {}
    for run in plan:
        allowed[(run.arm, run.seed)] = allowed.get((run.arm, run.seed), 0) + (run.limit(unit) or 0)
    stopped = []
    for seed in spec.seeds:
        spent = {name: a.spend[seed].get(unit) for name, a in arms.items() if seed in a.spend}
        if len(spent) < 2:
            continue
        top = max(spent.values())
        for name, value in spent.items():
            drift = (top - value) / top if top else 0.0
            if drift > spec.drift_tolerance:
                reasons = sorted({r for r in arms[name].stop_reasons.get(seed, []) if r})
                why = "; ".join(reasons) or "the optimizer returned before its budget (it recorded no reason)"
                stopped.append(f"{name} stopped at {value} of {allowed.get((name, seed), top)} {unit} at seed {seed} "
                               f"(the largest arm spent {top}): {why}")
    return stopped, []


def _mechanism_flags(spec: ArmsSpec, merge: ArmResult) -> list[str]:
    name = merge.arm
    flags = []
    parts = merge.parts_max if merge.parts_max is not None else merge.final_components
    if not merge.events.get("merge_attempt"):
        flags.append(f"{name}: the optimizer recorded no merge rounds (no width-{spec.width} merge ran)")
    if parts is not None and parts <= 1:
        flags.append(f"{name}: the artifact has one component: merging degenerates to selection")
    elif merge.events.get("merge_attempt") and not merge.events.get("union_built"):
        flags.append(f"{name}: merges never fired: no round combined the edits of two workers")
    return flags


def _conclude(spec: ArmsSpec, arms: dict[str, ArmResult], comparisons: Sequence[decide.Contrast],
              flags: Sequence[str], broken: Sequence[str], higher_is_better: bool = True) -> str:
    """The conclusion from the merge-vs-selected-fork contrast (Holm-adjusted with the other two);
    the contrast's sign says higher or lower, the metric's direction which of them is better."""
    merge = spec.arm_names[2]
    if broken:
        return "comparison broken (see BROKEN): no conclusion"
    primary = comparisons[0]
    better, worse = ("+", "-") if higher_is_better else ("-", "+")
    if flags:
        return (f"merging cannot explain any difference here ({flags[0].split(': ', 1)[1]}); "
                f"{primary.sentence}")
    if primary.sign == better and arms[merge].unions_accepted:
        return (f"merging helped: {merge} beats the selected fork at equal {spec.fixed} "
                f"({arms[merge].unions_accepted} union(s) accepted; Holm p = {primary.p_holm:.3g})")
    if primary.sign == better:
        return (f"{merge} beats the selected fork at equal {spec.fixed}, but no union was accepted: "
                f"the gain is not credited to merging (Holm p = {primary.p_holm:.3g})")
    if primary.sign == worse:
        return f"merging hurt: the selected fork beats {merge} at equal {spec.fixed} (Holm p = {primary.p_holm:.3g})"
    return f"no evidence that merging helps: {primary.sentence}"


def arms_table(run_dir: str | Path) -> tuple[list[dict[str, Any]], str]:
    """The report's hook: the arms table of an arms run dir as rows (one per reported arm, the
    fork arm twice) and as text (with confounds, separation, flags and the conclusion)."""
    comparison = compare_arms(run_dir)
    return comparison.rows(), comparison.text()


__all__ = ["MERGE_EVENTS", "RunSpend", "ArmResult", "ArmsComparison", "ledger_spend_and_events", "compare_arms",
           "arms_table"]
