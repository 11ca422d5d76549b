"""What one arms experiment is (the overview is :mod:`heldout.protocols.arms`): its spec
(:class:`ArmsSpec`: task, optimizer, budget B in the fixed unit, width N, seeds), the runs it
plans (:func:`plan_arms`: per arm, per fork, per seed, with their limits in every unit and their
run dirs) and the seed's headroom below the task's ceiling (:class:`Headroom`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from heldout.contracts import HeldoutError
from heldout.evaluators.scoring import Decoding
from heldout.optimizers import split_spec
from heldout.protocols import decide
from heldout.protocols.run import Cell, Method

ARMS_FILE = "arms.json"
RESULT_FILE = "arms_result.json"
FIXED_UNITS = ("metric_calls", "architect_calls", "tokens")
MIN_SEEDS = decide.MIN_SEEDS
DEFAULT_DRIFT_TOLERANCE = 0.10
DEFAULT_MIN_HEADROOM = 0.10


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
        decoding, task_options = Decoding.split(self.options)  # an arm's options as a study states them
        return Cell(self.task, Method(self.method, self.target), self.seed, self.metric_calls, self.profile,
                    task_options, decoding=decoding)

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


__all__ = ["ARMS_FILE", "RESULT_FILE", "FIXED_UNITS", "MIN_SEEDS", "DEFAULT_DRIFT_TOLERANCE", "DEFAULT_MIN_HEADROOM",
           "ArmsError", "ArmsSpec", "PlannedRun", "plan_arms", "describe_plan", "Headroom"]
