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

from typing import Any

from heldout.benchmarks.candidates import read_candidate
from heldout.contracts import (Candidate, Example, Message, RunLimits, Source, TaskKind, Verdict,
                               mean_score)

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
