"""The contracts every benchmark module shares.

A benchmark module (``heldout/benchmarks/<family>.py`` or a package of that name) defines one
subclass of :class:`Benchmark` per family and registers one instance per task with
:func:`heldout.benchmarks.registry.register`. Every module has the same shape:

* ``load_raw(data_dir)``  -> the examples exactly as the source holds them (no split, no check);
* ``seed_candidate()``    -> the task's unoptimised starting candidate;
* prompt tasks:  ``render(candidate, example)`` -> chat messages, and
  ``score_text(text, example)`` -> :class:`Verdict`;
* program tasks: ``run(candidate, example, limits)`` -> :class:`Verdict` (runs in the sandbox).

Splits, hashing and drift checks are *not* the module's business: they live in the manifest
(:mod:`heldout.data_manifests`) and are applied by :func:`heldout.load_task`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping

Candidate = dict[str, str]
"""What an optimizer proposes: named text components (``{"instruction": ...}``,
``{"program.py": ...}``, ``{"scorer.sql": ...}``)."""

TaskKind = Literal["prompt", "program"]


def canonical_json(value: Any) -> str:
    """The one serialisation used for every hash in heldout: sorted keys, no whitespace,
    non-ASCII kept, integers of any size kept exactly."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def candidate_id(candidate: Mapping[str, str]) -> str:
    """A candidate is identified by the sha256 of its canonical JSON."""
    check_candidate(candidate)
    return sha256_text(canonical_json(dict(candidate)))


def check_candidate(candidate: Any) -> None:
    """Raise ``MalformedCandidate`` unless ``candidate`` is a non-empty ``dict[str, str]``."""
    if not isinstance(candidate, Mapping) or not candidate:
        raise MalformedCandidate(
            f"a candidate must be a non-empty dict of named text components, got {type(candidate).__name__}"
        )
    for key, value in candidate.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise MalformedCandidate(
                f"candidate component {key!r} must map a str name to str text, got {type(value).__name__}"
            )


class HeldoutError(Exception):
    """Base class of every error heldout raises on purpose (always with a clear message)."""


class MalformedCandidate(HeldoutError, ValueError):
    pass


class DataError(HeldoutError):
    """Data could not be loaded or does not match its manifest."""


@dataclass(frozen=True)
class Example:
    """One scored unit. ``target`` is hidden from optimizers unless the split allows it.

    ``group`` is the topic/family key protocols split on (None when the task has none)."""

    id: str
    input: dict[str, Any]
    target: Any
    group: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise TypeError(f"example ids are strings, got {self.id!r} ({type(self.id).__name__})")

    def content_hash(self) -> str:
        """sha256 of the canonical JSON of ``input`` + ``target``: what manifests freeze."""
        return sha256_text(canonical_json({"input": self.input, "target": self.target}))


@dataclass
class Verdict:
    """The result of scoring one candidate on one example.

    Rule: a scorer never raises for one bad example or one bad output; it returns a verdict with
    ``score=0.0``, ``valid=False`` and ``error`` set to a clear message (``error_kind`` names the
    class of failure: ``timeout``, ``memory``, ``crash``, ``bad_output``, ``forbidden``,
    ``malformed_candidate``, ``model_error`` ...)."""

    example_id: str
    score: float
    valid: bool = True
    dimensions: dict[str, float] = field(default_factory=dict)
    feedback: str = ""
    error: str | None = None
    error_kind: str | None = None
    output: Any = None  # what the candidate produced (model text, extracted answer, objective...)
    usage: dict[str, float] = field(default_factory=dict)  # tokens, seconds

    def __post_init__(self) -> None:
        if not isinstance(self.score, (int, float)) or not math.isfinite(self.score):
            raise ValueError(f"verdict score must be a finite number, got {self.score!r}")
        self.score = float(self.score)

    @classmethod
    def failure(cls, example_id: str, error: str, kind: str, **extra: Any) -> "Verdict":
        return cls(example_id=example_id, score=0.0, valid=False, error=error, error_kind=kind,
                   feedback=extra.pop("feedback", error), **extra)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Verdict":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class RunLimits:
    """Resource limits for one sandboxed execution; per task, overridable, printed in verdicts."""

    wall_seconds: float = 30.0
    cpu_seconds: float = 30.0
    memory_mb: int = 2048
    max_processes: int = 64
    max_file_mb: int = 16
    max_open_files: int = 256
    max_output_bytes: int = 4 * 1024 * 1024

    def replace(self, **changes: Any) -> "RunLimits":
        values = asdict(self)
        values.update({k: v for k, v in changes.items() if v is not None})
        return RunLimits(**values)


@dataclass(frozen=True)
class Source:
    """Where a task's data comes from: a hub dataset at a pinned revision, or mirror files (paths
    relative to a data dir laid out like ``../shared/data``)."""

    hub_id: str | None = None
    config: str | None = None
    split: str | None = None
    revision: str | None = None
    mirror_files: tuple[str, ...] = ()
    embedded: bool = False  # the examples are generated by heldout itself (program tasks)


class Benchmark:
    """A named, versioned benchmark cell. Subclasses fill in the class attributes and the
    methods of their kind. Instances are stateless and cheap; data is loaded on demand."""

    name: str = ""
    family: str = ""
    kind: TaskKind = "prompt"
    metric: str = "accuracy"
    version: str = "1"
    description: str = ""
    source: Source = Source()
    default_limits: RunLimits = RunLimits()

    # -- data -------------------------------------------------------------------------------
    def load_raw(self, data_dir: str | None) -> list[Example]:
        """Every example of the task, in source order, from the mirror dir when given, else from
        the hub at the pinned revision. Raises :class:`DataError` with a clear message."""
        raise NotImplementedError

    def seed_candidate(self) -> Candidate:
        raise NotImplementedError

    # -- prompt tasks -----------------------------------------------------------------------
    def render(self, candidate: Candidate, example: Example) -> list[Message]:
        raise NotImplementedError(f"{self.name} is not a prompt task")

    def score_text(self, text: str, example: Example) -> Verdict:
        """Score free model text against the example's target. Never raises."""
        raise NotImplementedError(f"{self.name} is not a prompt task")

    # -- program tasks ----------------------------------------------------------------------
    def run(self, candidate: Candidate, example: Example, limits: RunLimits | None = None,
            **options: Any) -> Verdict:
        """Execute the candidate on one example (in the sandbox) and score it. Never raises for
        a bad candidate."""
        raise NotImplementedError(f"{self.name} is not a program task")

    # -- the `heldout eval` surface (program tasks; prompt tasks need a worker) ---------------
    def candidate_from_path(self, path: str) -> Candidate:
        """Read a candidate from a file or folder: a ``.json`` file holding a dict of components
        is taken as is; another file becomes ``{<default component>: text}``; a folder becomes
        one component per file (relative paths)."""
        from heldout.benchmarks.candidates import read_candidate

        return read_candidate(path, self.default_component)

    default_component: str = "program.py"

    def summarize(self, candidate: Candidate, verdicts: list[Verdict], **options: Any) -> dict[str, Any]:
        """The one-object summary `heldout eval --json` prints. Subclasses add task fields
        (objective, cycles, exhaustive_accuracy ...) but keep these keys."""
        n = len(verdicts)
        errors = [v.error for v in verdicts if v.error]
        return {"task": self.name, "valid": bool(n) and all(v.valid for v in verdicts),
                "score": sum(v.score for v in verdicts) / n if n else 0.0, "n": n,
                "error": errors[0] if errors else None}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.family, "kind": self.kind,
                "metric": self.metric, "version": self.version, "description": self.description}
