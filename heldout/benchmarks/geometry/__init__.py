"""Open-ended geometry program tasks (AlphaEvolve problems as used by CoCoEvolve / AEvo):
``circle_packing/square26``, ``circle_packing/rect21``, ``heilbronn/triangle11``,
``heilbronn/convex13``, ``minmax/d3n14``, ``autocorrelation/second``.

A candidate is a program (``{"program.py": ...}``) exposing the public entry point of its task,
so existing evolved programs run unchanged. It runs in the sandbox
(:mod:`heldout.sandbox`); its return value comes back as plain data and is scored by
:mod:`heldout.benchmarks.geometry.scoring`: non-finite values rejected first, validity at zero
tolerance unless ``tolerance=`` is given, every quantity recomputed. A program's own claim
(``run_packing``'s sum, AC2's C2) is compared with the recomputed value and reported, never
used: the score is always the recomputed value.

Each task has one example, the instance itself (``id="instance"``); its split profile
``default`` has it in train and test ("train = test by design" for a single-instance task).
Verdict: ``score`` = raw objective (0 when invalid); ``dimensions`` carry ``ratio`` =
objective / a stated best-known value, the tolerance and the largest constraint violation;
the feedback lists violations (which circles overlap or leave the host, by how much) and the
limits used."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from heldout.contracts import (Candidate, Example, HeldoutError, MalformedCandidate, RunContext, RunLimits, Source,
                               Verdict, check_candidate)
from heldout.benchmarks.base import Benchmark
from heldout.benchmarks.geometry import scoring
from heldout.benchmarks.geometry.scoring import Scored
from heldout.benchmarks.registry import register
from heldout.data_manifests import freeze
from heldout.sandbox import SandboxError, run_function, PROGRAM_PRELOAD, wall_backstop

SEED_DIR = Path(__file__).resolve().parent / "seeds"
ENTRY_MODULE = "_heldout_entry"
CLAIM_RTOL = 1e-9  # a claim within this relative distance of the recomputed value "matches"



class GeometryError(HeldoutError):
    pass


@dataclass(frozen=True)
class Reference:
    """The value ``ratio`` divides by, and where it comes from (stated in every summary)."""

    value: float
    source: str


@dataclass
class Interpreted:
    scored: Scored
    claimed: float | None = None
    notes: list[str] = field(default_factory=list)


Interpret = Callable[[str, Any, float], Interpreted]
"""Reads what the entry point returned (plain data) at a tolerance into a scored result."""


@dataclass(frozen=True)
class GeometrySpec:
    """One geometry task as data: what differs between the six is only this."""

    name: str
    description: str
    entries: tuple[str, ...]
    seed_file: str
    instance: dict[str, Any]
    reference: Reference
    interpret: Interpret
    limits: RunLimits

    @property
    def family(self) -> str:
        return self.name.split("/", 1)[0]


class GeometryTask(Benchmark):
    """A geometry task defined by a :class:`GeometrySpec` (the table at the end of this module)."""

    kind = "program"
    metric = "objective"
    source = Source(embedded=True)
    default_tolerance = 0.0

    def __init__(self, spec: GeometrySpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.family = spec.family
        self.description = spec.description
        self.entries = spec.entries
        self.reference = spec.reference
        self.instance = spec.instance
        self.default_limits = spec.limits
        self.score_ceiling = spec.reference.value

    # -- data ---------------------------------------------------------------------------------
    def load_raw(self, data_dir: str | None = None) -> list[Example]:
        return [Example(id="instance", input={"task": self.name, "entry_points": list(self.entries),
                                              **self.instance},
                        target={"reference": self.reference.value, "reference_source": self.reference.source},
                        meta={"single_instance": True})]

    def seed_candidate(self) -> Candidate:
        return {"program.py": (SEED_DIR / self.spec.seed_file).read_text(encoding="utf-8")}

    family_dir = Path(__file__).resolve().parent
    helper_sources = {f"{ENTRY_MODULE}.py": "entry_helper.py"}

    # -- scoring the returned value (no sandbox) ------------------------------------------------
    def score_value(self, entry: str, value: Any, tolerance: float | None = None) -> Interpreted:
        """Score what the entry point returned (plain data). Used by :meth:`run` after the sandbox
        and directly by tests. Never raises."""
        tol = self._tolerance(tolerance)
        try:
            return self.spec.interpret(entry, value, tol)
        except (TypeError, ValueError, IndexError, KeyError, OverflowError) as exc:
            return Interpreted(Scored.bad(f"could not read the return value of {entry}(): {exc}"))

    def _tolerance(self, tolerance: float | None) -> float:
        tol = self.default_tolerance if tolerance is None else tolerance
        if not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
            raise GeometryError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
        return float(tol)

    # -- running a program ----------------------------------------------------------------------
    def run(self, candidate: Candidate, example: Example, context: RunContext | None = None) -> Verdict:
        context = context or self.context()
        tol = self._tolerance(context.option("tolerance"))
        limits = context.limits
        limits_text = describe_limits(limits)
        base_dims = {"tolerance": tol}
        try:
            check_candidate(candidate)
            module = program_module(candidate)
            result = run_function(candidate, ENTRY_MODULE, "call", [module, list(self.entries)],
                                  limits=limits, setup_files=self.helper_files(), preload=PROGRAM_PRELOAD)
        except (MalformedCandidate, SandboxError) as exc:
            return Verdict.failure(example.id, str(exc), "malformed_candidate", dimensions=base_dims,
                                   feedback=f"{exc}\n{limits_text}; tolerance {tol:g}")
        usage = {"seconds": result.seconds}
        if not result.ok:
            feedback = f"{result.error_kind}: {result.error}\n{limits_text} (isolation {result.isolation})"
            if result.stdout_tail:
                feedback += f"\n--- program output (tail)\n{result.stdout_tail[-1500:]}"
            return Verdict.failure(example.id, result.error or result.error_kind or "failed",
                                   result.error_kind or "crash", dimensions=base_dims, usage=usage,
                                   feedback=feedback, output={"limits": limits.__dict__, "tolerance": tol})
        value = result.value
        if not isinstance(value, dict) or "entry" not in value:
            return Verdict.failure(example.id, "bad output: the entry helper returned nothing usable",
                                   "bad_output", dimensions=base_dims, usage=usage)
        got = self.score_value(value["entry"], value.get("value"), tol)
        return self._verdict(example.id, value["entry"], got, tol, limits, usage)

    def _verdict(self, example_id: str, entry: str, got: Interpreted, tol: float, limits: RunLimits,
                 usage: dict[str, float]) -> Verdict:
        s = got.scored
        ratio = s.objective / self.reference.value if s.valid else 0.0
        dims = {"tolerance": tol, "objective": s.objective, "ratio": ratio,
                "max_violation": s.max_violation if math.isfinite(s.max_violation) else 0.0}
        output = {"entry": entry, "objective": s.objective, "ratio": ratio, "tolerance": tol,
                  "reference": self.reference.value, "reference_source": self.reference.source,
                  "violations": s.violations, "claimed": got.claimed, "details": s.details,
                  "limits": limits.__dict__}
        lines = [f"{self.name}: {'valid' if s.valid else 'INVALID'} at tolerance {tol:g}; "
                 f"objective {s.objective:.16g}; ratio {ratio:.9f} (to {self.reference.value!r}, "
                 f"{self.reference.source})"]
        lines += [f"  {v}" for v in s.violations]
        lines += [f"  note: {n}" for n in got.notes]
        lines.append(describe_limits(limits))
        feedback = "\n".join(lines)
        if not s.valid:
            return Verdict.failure(example_id, s.error or "invalid", s.error_kind or "invalid",
                                   dimensions=dims, feedback=feedback, output=output, usage=usage)
        return Verdict(example_id=example_id, score=s.objective, valid=True, dimensions=dims,
                       feedback=feedback, output=output, usage=usage)

    def summarize(self, candidate: Candidate, verdicts: list[Verdict],
                  context: RunContext | None = None) -> dict[str, Any]:
        summary = super().summarize(candidate, verdicts, context)
        v = verdicts[0] if verdicts else None
        out = v.output if v is not None and isinstance(v.output, dict) else {}
        tol = (context or self.context()).option("tolerance")
        summary.update({
            "objective": v.dimensions.get("objective", 0.0) if v else 0.0,
            "ratio": v.dimensions.get("ratio", 0.0) if v else 0.0,
            "ratio_reference": {"value": self.reference.value, "source": self.reference.source},
            "tolerance": self._tolerance(tol),
            "error_kind": v.error_kind if v else None,
            "violations": out.get("violations", []),
            "claimed": out.get("claimed"),
            "entry": out.get("entry"),
        })
        return summary


def describe_limits(limits: RunLimits) -> str:
    return (f"limits: {limits.wall_seconds:g} s wall, {limits.cpu_seconds:g} s cpu, {limits.memory_mb} MB memory, "
            f"{limits.max_processes} processes, {limits.max_output_bytes} output bytes")


def program_module(candidate: Candidate) -> str:
    """The module to import: ``program.py`` when present, else the only top-level ``.py`` file."""
    if "program.py" in candidate:
        return "program"
    top = [name for name in candidate if name.endswith(".py") and "/" not in name]
    if len(top) != 1:
        raise MalformedCandidate(f"cannot tell which file is the program: name it program.py "
                                 f"(got {sorted(candidate)[:5]})")
    stem = top[0][:-3]
    if not stem.isidentifier():
        raise MalformedCandidate(f"program file name {top[0]!r} is not an importable module name")
    return stem


def _claim(objective_of: Callable[[], Scored], claimed: Any, what: str) -> Interpreted:
    scored = objective_of()
    notes: list[str] = []
    claim: float | None = None
    try:
        claim = float(claimed)
    except (TypeError, ValueError, OverflowError):
        notes.append(f"the program's claimed {what} ({str(claimed)[:40]!r}) is not a number; ignored")
    if claim is not None:
        if not math.isfinite(claim):
            notes.append(f"the program claims a non-finite {what} ({claim}); ignored")
            claim = None
        elif scored.valid and abs(claim - scored.objective) > CLAIM_RTOL * max(1.0, abs(scored.objective)):
            notes.append(f"the program claims {what} = {claim!r} but the recomputed value is "
                         f"{scored.objective!r}; the recomputed value is scored")
    return Interpreted(scored, claim, notes)


# -- the six tasks -------------------------------------------------------------------------------
def _square26(entry: str, value: Any, tol: float) -> Interpreted:
    if entry == "run_packing":
        if not isinstance(value, list) or len(value) != 3:
            return Interpreted(Scored.bad("run_packing() must return (centers, radii, reported_sum)"))
        centers, radii, claimed = value
        return _claim(lambda: scoring.circles_in_square(centers, radii, n=26, tol=tol), claimed, "sum of radii")
    arr = scoring.as_array(value, (26, 3), "the packing (rows [x, y, r] of 26 circles)")
    if isinstance(arr, Scored):
        return Interpreted(arr)
    return Interpreted(scoring.circles_in_square(arr[:, :2], arr[:, 2], n=26, tol=tol))


def _rect21(entry: str, value: Any, tol: float) -> Interpreted:
    arr = scoring.as_array(value, (21, 3), "the packing (rows [x, y, r] of 21 circles)")
    if isinstance(arr, Scored):
        return Interpreted(arr)
    return Interpreted(scoring.circles_in_rectangle(arr[:, :2], arr[:, 2], n=21, tol=tol))


def _points(scorer: Callable[..., Scored], **shape: int) -> Interpret:
    return lambda entry, value, tol: Interpreted(scorer(value, tol=tol, **shape))


def _autocorrelation(entry: str, value: Any, tol: float) -> Interpreted:
    if not isinstance(value, list) or len(value) != 4:
        return Interpreted(Scored.bad("run() must return (heights, c2, loss, n_points)"))
    heights, claimed, _loss, n_points = value
    got = _claim(lambda: scoring.autocorrelation_c2(heights, tol=tol), claimed, "C2")
    if got.scored.valid and n_points != got.scored.details.get("n_steps"):
        got.notes.append(f"the program reports n_points = {str(n_points)[:20]} but returned "
                         f"{got.scored.details.get('n_steps')} heights")
    return got


def _limits(seconds: float, memory_mb: int, **extra: Any) -> RunLimits:
    # the limit is CPU time, stable under load (issue 53); wall time is only its backstop
    return RunLimits(wall_seconds=wall_backstop(seconds), cpu_seconds=seconds, memory_mb=memory_mb, **extra)


_BENCHMARK_CONSTANT = "the OpenEvolve-math / CodeEvolve BENCHMARK constant"

SPECS = (
    GeometrySpec(
        "circle_packing/square26", "26 disjoint discs in the unit square, maximise the sum of radii",
        ("circle_packing26", "run_packing"), "circle_packing26.py",
        {"n": 26, "host": "unit square [0,1]^2", "returns": "(26,3) rows [x, y, r]; or run_packing() -> "
         "(centers (26,2), radii (26,), claimed_sum)"},
        Reference(2.6358627564136983, "AlphaEvolve 2025 B.12 construction 1 (the CodeEvolve / "
                  "OpenEvolve-math BENCHMARK constant)"),
        _square26, _limits(180.0, 2048)),
    GeometrySpec(
        "circle_packing/rect21",
        "21 disjoint discs in a rectangle of perimeter 4 (aspect free), maximise the sum of radii",
        ("circle_packing21",), "circle_packing21.py",
        {"n": 21, "host": "axis-aligned bounding box of the circles, w + h <= 2", "returns": "(21,3) rows [x, y, r]"},
        Reference(2.3658321334167627, f"AlphaEvolve 2025 B.13 ({_BENCHMARK_CONSTANT})"),
        _rect21, _limits(360.0, 2048)),
    GeometrySpec(
        "heilbronn/triangle11",
        "11 points in the unit-side equilateral triangle, maximise the smallest triangle area / host area",
        ("heilbronn_triangle11",), "heilbronn_triangle11.py",
        {"n": 11, "host": "triangle (0,0), (1,0), (1/2, sqrt(3)/2)", "returns": "(11,2) points"},
        Reference(0.036529889880030156, f"AlphaEvolve 2025 B.9 ({_BENCHMARK_CONSTANT})"),
        _points(scoring.heilbronn_triangle, n=11), _limits(360.0, 4096)),
    GeometrySpec(
        "heilbronn/convex13", "13 points in the plane, maximise the smallest triangle area / convex hull area",
        ("heilbronn_convex13",), "heilbronn_convex13.py",
        {"n": 13, "host": "the points' convex hull", "returns": "(13,2) points"},
        Reference(0.030936889034895654, f"AlphaEvolve 2025 B.10 construction 1 ({_BENCHMARK_CONSTANT})"),
        _points(scoring.heilbronn_convex, n=13), _limits(180.0, 4096)),
    GeometrySpec(
        "minmax/d3n14", "14 points in R^3, maximise (min distance / max distance)^2",
        ("min_max_dist_dim3_14",), "min_max_dist_dim3_14.py", {"n": 14, "d": 3, "returns": "(14,3) points"},
        Reference(1 / 4.165849767, f"AlphaEvolve 2025 B.8 construction 2, 1/4.165849767 ({_BENCHMARK_CONSTANT})"),
        _points(scoring.min_max_distance, n=14, d=3), _limits(360.0, 4096)),
    GeometrySpec(
        "autocorrelation/second",
        "non-negative step function maximising the C2 ratio ||f*f||_2^2 / (||f*f||_1 ||f*f||_inf)",
        ("run",), "autocorrelation_second.py",
        {"max_steps": scoring.AC2_MAX_STEPS, "returns": "run() -> (heights (N,), claimed_c2, loss, n_points)"},
        Reference(0.8962799441554086, f"AlphaEvolve 2025 B.2, 50 steps ({_BENCHMARK_CONSTANT})"),
        _autocorrelation, _limits(360.0, 4096, max_output_bytes=64 * 1024 * 1024)),
)

TASKS = [register(GeometryTask(spec)) for spec in SPECS]


def freeze_manifests() -> list[Path]:
    """(Re)write the six manifests: one embedded instance, profile ``default`` train = test.
    ``python -c "from heldout.benchmarks.geometry import freeze_manifests; freeze_manifests()"``"""
    paths = []
    for task in TASKS:
        examples = task.load_raw(None)
        ids = [ex.id for ex in examples]
        manifest = freeze(task.name, task.version, task.source, examples,
                          {"default": {"train": ids, "test": ids}},
                          notes={"default": "train = test by design: a single-instance task"})
        paths.append(manifest.save())
    return paths
