"""The base class every task module builds on.

A family module (``heldout/benchmarks/<family>.py`` or a package of that name, or a module of
another package listed under the ``heldout.tasks`` entry-point group) defines its tasks as
instances of a :class:`Benchmark` subclass and registers each with
:func:`heldout.benchmarks.registry.register` at import time. Every module has the same shape:

* ``load_raw(data_dir)``  -> the examples exactly as the source holds them (no split, no check);
* ``seed_candidate()``    -> the task's unoptimised starting candidate (seed files of program
  tasks live in the family's ``seeds/`` folder);
* prompt tasks:  ``render(candidate, example, context)`` -> chat messages, and
  ``score_text(text, example, context)`` -> :class:`Verdict`;
* program tasks: ``run(candidate, example, context)`` -> :class:`Verdict` (runs in the sandbox,
  with the trusted helper files ``helper_files()`` written next to the candidate);
* ``aggregate(verdicts)`` -> the task's stated metric over examples (default: the mean); run
  records, reports, the gate and ``heldout eval`` all use it;
* ``verifier_options`` -> the weak test sets a verifier variant may switch to (optimisation only).

The :class:`RunContext` (limits, the metered worker, the task options) is built by the harness
and passed to every run/score call. Splits, hashing and drift checks are *not* the module's
business: they live in the manifest (:mod:`heldout.data_manifests`) and are applied by
:func:`heldout.load_task`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heldout.benchmarks.candidates import read_candidate
from heldout.contracts import (Candidate, Example, HeldoutError, Message, MetricSpec, RunContext, RunLimits, Source,
                               TaskKind, Verdict)

class Benchmark:
    """A task's definition (see :mod:`heldout.contracts` for task / benchmark / loaded task): a
    named, versioned benchmark cell's rules without its data. Subclasses fill in the class
    attributes and the methods of their kind. Instances are stateless and cheap; data is loaded on
    demand, and :func:`heldout.benchmarks.loading.load_task` binds it to a split profile (a
    :class:`~heldout.benchmarks.loading.Task`)."""

    name: str = ""
    family: str = ""
    kind: TaskKind = "prompt"
    metric: MetricSpec | str = MetricSpec("accuracy")
    """What the score is, its direction and aggregation (:class:`heldout.contracts.MetricSpec`); a
    plain name is a higher-is-better mean. Read it through :attr:`metric_spec`."""
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

    def context(self, limits: RunLimits | None = None, worker=None, **options: Any) -> RunContext:
        """A :class:`RunContext` for calling this task directly (tests, ``heldout eval``): the
        task's default limits unless given."""
        return RunContext(limits=limits or self.default_limits, worker=worker, options=options)

    # -- prompt tasks -----------------------------------------------------------------------
    def render(self, candidate: Candidate, example: Example, context: RunContext | None = None) -> list[Message]:
        raise NotImplementedError(f"{self.name} is not a prompt task")

    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        """Score free model text against the example's target. Never raises."""
        raise NotImplementedError(f"{self.name} is not a prompt task")

    # -- program tasks ----------------------------------------------------------------------
    def run(self, candidate: Candidate, example: Example, context: RunContext | None = None) -> Verdict:
        """Execute the candidate on one example (in the sandbox) and score it. Never raises for
        a bad candidate."""
        raise NotImplementedError(f"{self.name} is not a program task")

    family_dir: Path | None = None
    """The family's folder (helper files and ``seeds/`` live there)."""

    helper_sources: dict[str, str] = {}
    """Trusted files the sandbox gets next to the candidate: {name in the sandbox: file in the
    family folder}. Nothing else of heldout is visible to a candidate."""

    def helper_files(self) -> dict[str, str]:
        """The trusted helper files' text, keyed by their name in the sandbox."""
        if self.family_dir is None and self.helper_sources:  # the task's own mistake, so a raise, never -O's silence
            raise HeldoutError(f"{self.name}: helper_sources need family_dir (the folder they are read from)")
        return {name: (self.family_dir / rel).read_text(encoding="utf-8") for name, rel in self.helper_sources.items()}

    # -- the metric -------------------------------------------------------------------------
    score_ceiling: float = 1.0
    """The best score the metric can reach (coarse verifier variants quantise below it)."""

    verifier_options: dict[str, dict[str, Any]] = {}
    """Weak test sets a verifier variant may select for optimisation, as task options
    (e.g. MBPP+ ``{"base-only": {"tests": "base"}}``). Held-out scoring never uses them."""

    @property
    def metric_spec(self) -> MetricSpec:
        return MetricSpec.of(self.metric)

    def aggregate(self, verdicts: list[Verdict]) -> float:
        """The task's stated metric over a split's verdicts: its spec's named aggregation (default:
        the mean score; an invalid verdict counts as the spec's ``failure_score``)."""
        return self.metric_spec.aggregate(verdicts)

    def extra_metrics(self, candidate: Candidate, verdicts: list[Verdict],
                      context: RunContext | None = None) -> dict[str, float]:
        """Further held-out numbers a report shows beside the metric (e.g. Lockpicking's
        exhaustive accuracy). Computed by the harness on the final candidate only."""
        return {}

    # -- the `heldout eval` surface (program tasks; prompt tasks need a worker) ---------------
    def candidate_from_path(self, path: str) -> Candidate:
        """Read a candidate from a file or folder: a ``.json`` file holding a dict of components
        is taken as is; another file becomes ``{<default component>: text}``; a folder becomes
        one component per file (relative paths)."""
        return read_candidate(path, self.default_component)

    default_component: str = "program.py"

    def summarize(self, candidate: Candidate, verdicts: list[Verdict],
                  context: RunContext | None = None) -> dict[str, Any]:
        """The one-object summary `heldout eval --json` prints: the aggregate as ``score`` plus
        the extra metrics. Subclasses add task fields (cycles, bottleneck ...) but keep these."""
        n = len(verdicts)
        errors = [v.error for v in verdicts if v.error]
        return {"task": self.name, "valid": bool(n) and all(v.valid for v in verdicts),
                "score": self.aggregate(verdicts), "n": n, "error": errors[0] if errors else None,
                **self.extra_metrics(candidate, verdicts, context)}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.family, "kind": self.kind,
                "metric": self.metric_spec.name, "version": self.version, "description": self.description}
