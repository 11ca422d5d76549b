"""Equal-budget arms: serial vs best-of-N fork vs merge-of-N, over one workload.

Throughput cannot tell merging from sampling-and-selecting; only held-out quality at an equal
budget can. Three arms, each replicated over the same seeds:

* ``serial``: one run of budget B (the optimizer at width 1);
* ``fork-of-N``: N independent runs of B/N each (width 1, random streams 0..N-1), reported twice:
  the *selected* fork (best on val, else on train when the task has no val, scored on test:
  what one can ship) and the *oracle* fork (best on test: an upper bound nobody can ship);
* ``merge-of-N``: one run of width N whose workers' proposals are merged, budget B.

Rules:

* **One fixed unit** (``metric_calls``, ``architect_calls`` or ``tokens``, the architect's) is
  enforced by every session; the other units are only capped (``metric_cap``) and are measured
  and printed as **confounds**. Spend is counted from the ledgers (the system of record) and must
  agree with the run records. **Equal allowed budget is the rule**: an arm whose spend, at any
  seed, is more than ``drift_tolerance`` (default 10%) below the largest arm's is reported as
  *stopped by itself* with the optimizer's reason ("serial stopped at 400 of 600 metric_calls:
  converged"), not as broken. **Broken** is for what the harness got wrong: a missing or failed
  run, a ledger that does not verify, a record that disagrees with its ledger, a run whose
  allowed budget is not the planned one or that spent over it, or a fixed unit no arm spent.
* **Separation**: the rule ``seed-paired-contrast`` of :mod:`heldout.protocols.decide`: seeds
  are the unit, the arms are paired by seed (they share seeds and random streams), at least 3
  seeds, Holm across the three comparisons printed. Never from seed ranges.
* **Mechanism evidence**: the ``optimizer_event`` entries of each arm's ledgers (how many merge
  rounds, unions built and accepted, conflicts). A merge arm whose artifact has one part
  (merging degenerates to selection) or whose unions never formed is flagged, and then no
  difference it shows is credited to merging.
* **Headroom** before spending: the seed candidate is scored on val (train when there is none)
  by the harness; little room to improve is a warning in the plan and the result.

Layout: ``RUN_DIR/arms.json`` (the experiment: spec, plan, headroom) and one study per arm,
``RUN_DIR/arm-<arm>/<task>/<method>/seed-<n>/``, with methods ``<optimizer>.serial``,
``<optimizer>.fork-<k>-of-<N>`` and ``<optimizer>.merge-of-<N>`` (distinct names, so a plain
``heldout report RUN_DIR`` reads every run). :func:`arms_table` is the report's hook.
"""

from __future__ import annotations

import inspect
import json
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from heldout.benchmarks.loading import load_task
from heldout.contracts import HeldoutError, MetricSpec
from heldout.data_manifests import Manifest
from heldout.evaluators.ledger import LEDGER_FILE, read_entries, verify_ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.evaluators.scoring import DEPLOYMENT, Scorer, Usage
from heldout.models import ModelClient, ResponseCache
from heldout.optimizers import check_optimizer, is_reference_optimizer, resolve_optimizer, split_spec
from heldout.protocols import decide
from heldout.protocols.run import Cell, Executor, LocalExecutor, Method, StudyConfig, check_infrastructure, run_study

ARMS_FILE = "arms.json"
RESULT_FILE = "arms_result.json"
FIXED_UNITS = ("metric_calls", "architect_calls", "tokens")
MIN_SEEDS = decide.MIN_SEEDS
DEFAULT_DRIFT_TOLERANCE = 0.10
DEFAULT_MIN_HEADROOM = 0.10
MERGE_EVENTS = ("merge_attempt", "union_built", "contested", "merge_round")


class ArmsError(HeldoutError):
    """The arms comparison cannot be planned or read as asked."""


@dataclass(frozen=True)
class ArmsSpec:
    """One arms experiment. ``budget`` is in the ``fixed`` unit; ``metric_cap`` caps metric calls
    per budget B when another unit is fixed (a fork run gets ``metric_cap // width``)."""

    task: str
    optimizer: str
    budget: int
    width: int
    seeds: tuple[int, ...]
    fixed: str = "metric_calls"
    profile: str = "default"
    metric_cap: int | None = None
    drift_tolerance: float = DEFAULT_DRIFT_TOLERANCE
    min_headroom: float = DEFAULT_MIN_HEADROOM
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fixed not in FIXED_UNITS:
            raise ArmsError(f"--fixed must be one of {', '.join(FIXED_UNITS)}, got {self.fixed!r}")
        if type(self.width) is not int or self.width < 2:
            raise ArmsError(f"--width must be an int >= 2 (a fork or merge of one is the serial arm), got {self.width!r}")
        if type(self.budget) is not int or self.budget < self.width:
            raise ArmsError(f"--budget must be an int >= --width ({self.width}) so every fork gets some budget, "
                            f"got {self.budget!r}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ArmsError(f"name each seed once, got {list(self.seeds)}")
        if self.fixed != "metric_calls" and not (type(self.metric_cap) is int and self.metric_cap >= self.width):
            raise ArmsError(f"--fixed {self.fixed} needs --metric-cap N (metric calls per run of budget B, "
                            f">= --width): without it nothing bounds the evaluations")
        if not 0 <= self.drift_tolerance < 1:
            raise ArmsError(f"drift tolerance must be in [0, 1), got {self.drift_tolerance}")
        name, options = split_spec(self.optimizer)
        if options:
            raise ArmsError(f"give the optimizer without options ({name!r}); the arms set width and stream")

    @property
    def arm_names(self) -> tuple[str, str, str]:
        return ("serial", f"fork-of-{self.width}", f"merge-of-{self.width}")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seeds": list(self.seeds)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ArmsSpec":
        return cls(**{**data, "seeds": tuple(data["seeds"])})


@dataclass(frozen=True)
class PlannedRun:
    """One session the comparison will make: its arm, fork index (None outside the fork arm),
    seed, limits in every unit (None: not limited) and where it goes."""

    arm: str
    fork: int | None
    seed: int
    metric_calls: int
    architect_calls: int | None
    architect_tokens: int | None
    method: str
    target: str
    arm_root: str
    task: str
    profile: str
    options: dict[str, Any]

    @property
    def cell(self) -> Cell:
        return Cell(self.task, Method(self.method, self.target), self.seed, self.metric_calls, self.profile,
                    dict(self.options))

    @property
    def run_dir(self) -> Path:
        return self.cell.run_dir(self.arm_root)

    def limit(self, unit: str) -> int | None:
        return {"metric_calls": self.metric_calls, "architect_calls": self.architect_calls,
                "tokens": self.architect_tokens}[unit]


def plan_arms(spec: ArmsSpec, run_dir: str | Path) -> list[PlannedRun]:
    """Every run of the comparison, in the order they execute: per arm, per fork, per seed."""
    name = spec.optimizer
    n = spec.width
    serial, fork, merge = spec.arm_names

    def limits(share: int) -> tuple[int, int | None, int | None]:
        if spec.fixed == "metric_calls":
            return spec.budget // share, None, None
        cap = spec.metric_cap // share
        per = spec.budget // share
        return (cap, per, None) if spec.fixed == "architect_calls" else (cap, None, per)

    runs: list[PlannedRun] = []

    def add(arm: str, fork_index: int | None, method: str, target: str, share: int) -> None:
        metric, calls, tokens = limits(share)
        root = str(Path(run_dir) / f"arm-{arm}")
        runs.extend(PlannedRun(arm, fork_index, seed, metric, calls, tokens, method, target, root, spec.task,
                               spec.profile, dict(spec.options)) for seed in spec.seeds)

    add(serial, None, f"{name}.serial", f"{name}?width=1", 1)
    for k in range(n):
        add(fork, k, f"{name}.fork-{k}-of-{n}", f"{name}?width=1&stream={k}", n)
    add(merge, None, f"{name}.merge-of-{n}", f"{name}?width={n}", 1)
    return runs


def describe_plan(spec: ArmsSpec, plan: Sequence[PlannedRun]) -> str:
    """Every run with its limits, and the totals per arm and overall in the fixed unit."""
    lines = [f"arms plan: {spec.task} [{spec.profile}], optimizer {spec.optimizer}, width {spec.width}, "
             f"budget B = {spec.budget} {spec.fixed} (fixed), seeds {','.join(map(str, spec.seeds))}"]
    if spec.fixed != "metric_calls":
        lines.append(f"  metric calls capped at {spec.metric_cap} per run of budget B (measured, not matched)")
    for run in plan:
        fork = "" if run.fork is None else f" fork {run.fork}"
        limits = ", ".join(f"{unit} {run.limit(unit)}" for unit in FIXED_UNITS if run.limit(unit) is not None)
        lines.append(f"  {run.arm:<14}{fork:<8} seed {run.seed:<4} {limits:<40} {run.run_dir}")
    for arm in spec.arm_names:
        mine = [r for r in plan if r.arm == arm]
        total = sum(r.limit(spec.fixed) or 0 for r in mine)
        lines.append(f"  total {arm}: {len(mine)} run(s), {total} {spec.fixed}")
    grand = sum(r.limit(spec.fixed) or 0 for r in plan)
    lines.append(f"  total: {len(plan)} run(s), {grand} {spec.fixed}")
    remainder = spec.budget % spec.width
    if remainder:
        lines.append(f"  note: B is not a multiple of {spec.width}; each fork gets {spec.budget // spec.width}, "
                     f"{remainder} {spec.fixed} of B unspent per seed (the drift check will tell if that matters)")
    return "\n".join(lines)


# -- headroom ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Headroom:
    """The seed candidate's score on ``split`` against the task's ceiling (its best score: the
    lowest for a lower-is-better metric, whose room is then measured downwards, against the seed)."""

    split: str
    seed_score: float
    ceiling: float
    min_headroom: float
    higher_is_better: bool = True

    @property
    def room(self) -> float:
        return (self.ceiling - self.seed_score) * (1 if self.higher_is_better else -1)

    @property
    def little(self) -> bool:
        return self.room < self.min_headroom * (self.ceiling if self.higher_is_better else self.seed_score)

    def describe(self) -> str:
        text = (f"headroom: the seed scores {self.seed_score:.4g} on {self.split} of a ceiling "
                f"{self.ceiling:.4g} (room {self.room:.4g})")
        if self.little:
            of = "the ceiling" if self.higher_is_better else "the seed's score (lower is better)"
            text += (f"; WARNING: little room to improve (< {self.min_headroom:.0%} of {of}): arms that "
                     "all reach the ceiling cannot be told apart")
        return text


def _client(model: str | None, config: StudyConfig) -> ModelClient | None:
    if not model:
        return None
    cache = ResponseCache(config.cache_dir) if config.cache_dir else None
    return ModelClient(model, base_url=config.base_url, cache=cache, concurrency=config.model_concurrency)


def check_headroom(spec: ArmsSpec, config: StudyConfig) -> Headroom:
    """Score the seed candidate on val (train when the profile has no val) with the canonical
    scorer, outside any session budget (a harness measurement, like held-out scoring)."""
    task = load_task(spec.task, spec.profile, config.data_dir, config.allow_drift)
    split = "val" if task.splits.get("val") else "train"
    bench = task.benchmark
    scorer = Scorer(bench, _client(config.worker_model, config), options=spec.options)
    verdicts = scorer.score_all(bench.seed_candidate(), task.splits.get(split, []), DEPLOYMENT, Usage(),
                                f"the seed's {split} headroom")
    return Headroom(split, bench.aggregate(verdicts) if verdicts else 0.0, bench.score_ceiling, spec.min_headroom,
                    bench.metric_spec.higher_is_better)


# -- running ---------------------------------------------------------------------------------------
def open_arms(spec: ArmsSpec, run_dir: str | Path) -> list[PlannedRun]:
    """The plan, after checking that ``run_dir`` holds this experiment or nothing (one run dir =
    one experiment; a different spec is an error naming what differs)."""
    path = Path(run_dir) / ARMS_FILE
    if path.exists():
        recorded = json.loads(path.read_text())["spec"]
        wanted = spec.to_dict()
        differing = [f"{k}: {recorded.get(k)!r} -> {wanted[k]!r}" for k in wanted if recorded.get(k) != wanted[k]]
        if differing:
            raise ArmsError(f"{run_dir} holds another arms experiment ({'; '.join(differing)}); use a new run dir")
    return plan_arms(spec, run_dir)


def run_arms(spec: ArmsSpec, run_dir: str | Path, config: StudyConfig, executor: Executor | None = None,
             progress: bool = True, headroom: Headroom | None = None) -> "ArmsComparison":
    """Check headroom, run every planned session (finished ones are skipped on a rerun), and
    compare. ``config`` holds the models and data dir; its run root and architect limits are set
    per arm here."""
    plan = open_arms(spec, run_dir)
    check_infrastructure([r.cell for r in plan], config)  # no worker or a dead endpoint: one line, before any file
    headroom = headroom or check_headroom(spec, config)
    root = Path(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / ARMS_FILE
    if not path.exists():
        path.write_text(json.dumps({"spec": spec.to_dict(), "plan": [asdict(r) for r in plan],
                                    "headroom": asdict(headroom),
                                    "config": {k: v for k, v in asdict(config).items() if k != "run_root"}},
                                   indent=1))
    executor = executor or LocalExecutor(1)
    for arm in spec.arm_names:
        mine = [r for r in plan if r.arm == arm]
        # one study per arm: the per-run limits in the architect units are the arm's
        arm_config = replace(config, run_root=mine[0].arm_root, architect_tokens=mine[0].architect_tokens,
                             architect_calls=mine[0].architect_calls)
        run_study([r.cell for r in mine], arm_config, executor, progress=progress)
    comparison = compare_arms(run_dir)
    (root / RESULT_FILE).write_text(json.dumps(comparison.to_dict(), indent=1, default=str))
    return comparison


# -- validation before spending ---------------------------------------------------------------------
def validate_arms(spec: ArmsSpec) -> list[str]:
    """What would make the experiment unable to conclude, found before any budget is spent: an
    unknown optimizer, one without a width mode (for this task), too few seeds. Raises
    :class:`ArmsError` naming the first problem; returns notes on the design otherwise. User code
    is read, not run (:func:`~heldout.optimizers.check_optimizer`): only heldout's own optimizers
    are asked whether they support this task's width."""
    try:
        check_optimizer(f"{spec.optimizer}?width={spec.width}&stream=0")
    except HeldoutError as exc:
        raise ArmsError(f"the arms need an optimizer with a width mode and random streams: {exc}") from None
    own = is_reference_optimizer(spec.optimizer)
    supports = getattr(inspect.getmodule(resolve_optimizer(spec.optimizer)), "supports_width", None) if own else None
    if supports is not None and not supports(spec.task):
        raise ArmsError(f"{spec.optimizer} has no width mode for {spec.task}: the merge arm cannot run")
    if len(spec.seeds) < MIN_SEEDS:
        raise ArmsError(f"{len(spec.seeds)} seed(s): the arms are compared with the seed as the unit and need "
                        f">= {MIN_SEEDS} seeds (e.g. --seeds 0,1,2)")
    n_test = int(Manifest.load(spec.task).sizes(spec.profile).get("test", 1))
    return [f"separation: {decide.RULES['seed-paired-contrast'].test}",
            "what it can detect: " + decide.describe_detectable(len(spec.seeds), family=3, n_examples=n_test)]


# -- reading the arms back -------------------------------------------------------------------------------
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
    stored = json.loads(path.read_text())
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
        result = arms[run.arm]
        where = run.run_dir
        if not (where / RECORD_FILE).is_file():
            broken.append(f"{run.arm} seed {run.seed}{'' if run.fork is None else f' fork {run.fork}'}: "
                          f"no finished run at {where}")
            continue
        ledger = verify_ledger(where)
        if not ledger.ok:
            broken.append(f"{where}: ledger does not verify ({'; '.join(ledger.problems[:2])})")
            continue
        record = RunRecord.load(where)
        metric = MetricSpec.from_record(record.experiment)  # every run is of spec.task: one metric
        if record.status != "ok" or record.test_score is None:
            broken.append(f"{where}: the run {record.status}: {record.error}")
            continue
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
        n_examples = len(record.test_verdicts)
        if run.fork is None:
            result.test[run.seed] = float(record.test_score)
            result.final_components = len(record.final_candidate or {})
        else:
            forks.setdefault(run.seed, []).append((run.fork, record))
    fork_result = arms[fork]
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
    unspent, problems = _underspend(spec, plan, arms)
    broken += problems
    flags = _mechanism_flags(spec, arms[merge])
    pairs = [(b if b != fork else f"{fork} (selected)", a, arms[b].test, arms[a].test)
             for a, b in ((merge, fork), (merge, serial), (serial, fork))]
    comparisons = decide.family(pairs, n_examples=max(n_examples, 1), paired=True, alpha=alpha)
    conclusion = _conclude(spec, arms, comparisons, flags, broken, metric.higher_is_better)
    return ArmsComparison(spec, arms, headroom, broken, comparisons, flags, conclusion, unspent)


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
