"""The shared vocabulary of heldout: every other module speaks in these terms.

This module depends on the standard library only (an isolated optimizer's sandbox may import it
without the rest of heldout). It holds:

* values: :data:`Candidate`, :class:`Example`, :class:`Verdict`, :class:`Message`,
  :class:`RunLimits`, :class:`Source`, :class:`RunContext`;
* the one hashing rule (:func:`canonical_json`, :func:`candidate_id`);
* the errors heldout raises on purpose (all subclasses of :class:`HeldoutError`);
* the Protocols that the parts meet at: :class:`Worker`, :class:`PromptTask`,
  :class:`ProgramTask`, :class:`Verifier`, :class:`TaskView`, :data:`Optimizer`.

Three words for a task, each for one thing:

* a **task** is what the CLI and study files name (``--task bbh/word_sorting``): one named,
  versioned benchmark cell;
* its **benchmark** is the task's definition, its rules without its data: an instance of
  :class:`heldout.benchmarks.base.Benchmark` meeting :class:`PromptTask` or :class:`ProgramTask`
  (how to load the examples, render or run a candidate, score, aggregate); stateless;
* a **loaded task** (:class:`heldout.benchmarks.loading.Task`, from ``load_task``) is that
  benchmark bound to one split profile, with its examples verified against the frozen manifest.

An optimizer sees none of them: it gets a :class:`TaskView`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence, runtime_checkable

Candidate = dict[str, str]
"""What an optimizer proposes: named text components (``{"instruction": ...}``,
``{"program.py": ...}``, ``{"scorer.sql": ...}``)."""

TaskKind = Literal["prompt", "program"]
SPLITS = ("train", "val", "test")


# -- hashing ----------------------------------------------------------------------------------------
def canonical_json(value: Any, *, strict: bool = False) -> str:
    """The one serialisation used for every hash in heldout: sorted keys, no whitespace,
    non-ASCII kept, integers of any size kept exactly. ``strict``: a NaN or an infinity raises
    ``ValueError``, for evidence heldout writes now (ledger entries, run records hold strict JSON,
    :func:`json_safe`); a reader re-deriving a hash is lenient, because evidence written before
    that may hold ``Infinity`` and must still verify."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=not strict)


def json_safe(value: Any) -> Any:
    """``value`` made strict JSON, for every JSON heldout writes for others to read (reports,
    ``--json`` output, ledger entries, run records): NaN becomes null and infinities the strings "inf"/"-inf" (``json.dumps``
    would write ``NaN`` and ``-Infinity``, which strict parsers such as ``jq`` refuse)."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- errors ------------------------------------------------------------------------------------------
class HeldoutError(Exception):
    """Base class of every error heldout raises on purpose (always with a clear message)."""


class MalformedCandidate(HeldoutError, ValueError):
    """A candidate is not a non-empty ``dict[str, str]``."""


class DataError(HeldoutError):
    """Data could not be loaded or does not match its manifest."""


class BudgetExceeded(HeldoutError):
    """An evaluation (or architect call) would exceed the session's budget; nothing ran.

    The same class is raised in-process and by the isolated client, so an optimizer catches one
    name in both modes."""


class VisibilityError(HeldoutError):
    """The optimizer asked for something its visibility policy does not allow (e.g. test)."""


# -- candidates --------------------------------------------------------------------------------------
def check_candidate(candidate: Any) -> Candidate:
    """Return a plain ``dict[str, str]`` copy of ``candidate``, or raise ``MalformedCandidate``.

    The copy is the boundary rule: subclasses of ``dict`` or ``str`` (which could hash as one
    candidate and run as another) are refused; what is hashed, recorded and built is this copy."""
    if type(candidate) is not dict or not candidate:
        raise MalformedCandidate(
            "a candidate must be a non-empty plain dict of named text components, "
            f"got {type(candidate).__name__}")
    plain: Candidate = {}
    for key, value in candidate.items():
        if type(key) is not str or type(value) is not str:
            raise MalformedCandidate(
                f"candidate component {key!r} must map a plain str name to plain str text, "
                f"got {type(key).__name__} -> {type(value).__name__}")
        plain[str(key)] = str(value)
    return plain


def candidate_id(candidate: Mapping[str, str]) -> str:
    """A candidate is identified by the sha256 of its canonical JSON."""
    return sha256_text(canonical_json(check_candidate(candidate)))


# -- examples and verdicts ---------------------------------------------------------------------------
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

    **The validity rule, stated once:** ``valid`` says whether the candidate *produced an output
    that could be scored*. A scored output is valid even when it is wrong or holds no extractable
    answer (score 0, the feedback says why). ``valid=False`` is reserved for failures to produce a
    scorable output at all: a crash, a timeout, a memory or output limit, a model error, a
    malformed candidate, an output of the wrong shape. Then ``score`` is 0.0 and ``error`` holds a
    clear message and ``error_kind`` naming the class of failure (``timeout``, ``memory``,
    ``crash``, ``bad_output``, ``forbidden``, ``malformed_candidate``, ``model_error`` ...).

    A scorer never raises for one bad example or one bad output; it returns such a verdict."""

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
        if isinstance(self.score, bool) or not isinstance(self.score, (int, float)) \
                or not math.isfinite(self.score):
            raise ValueError(f"verdict score must be a finite number, got {self.score!r}")
        self.score = float(self.score)
        if not self.valid and self.score != 0.0:
            raise ValueError("an invalid verdict scores 0.0")

    @classmethod
    def failure(cls, example_id: str, error: str, kind: str, **extra: Any) -> "Verdict":
        return cls(example_id=example_id, score=0.0, valid=False, error=error, error_kind=kind,
                   feedback=extra.pop("feedback", error), **extra)

    def to_dict(self) -> dict[str, Any]:
        """``dataclasses.asdict(self)``: a deep copy, so whoever holds it cannot change the verdict.
        Verdicts hold plain data (scalars, dicts, lists), copied here without asdict's per-value
        dispatch (in a ninth of its time); anything else is left to asdict."""
        try:
            return {name: _copy_plain(getattr(self, name)) for name in _VERDICT_FIELD_NAMES}
        except _NotPlain:
            return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Verdict":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


_VERDICT_FIELD_NAMES = tuple(Verdict.__dataclass_fields__)
_SCALARS = frozenset({str, int, float, bool, type(None)})  # asdict keeps these as they are


class _NotPlain(Exception):
    """A value :func:`_copy_plain` leaves to ``dataclasses.asdict``."""


def _copy_plain(value: Any) -> Any:
    """What ``asdict`` makes of plain data (exact dicts, lists, tuples and scalars): a deep copy."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {_copy_plain(k): _copy_plain(v) for k, v in value.items()}
    if kind is list:
        return [_copy_plain(v) for v in value]
    if kind is tuple:
        return tuple(_copy_plain(v) for v in value)
    raise _NotPlain


# -- errors are not scores --------------------------------------------------------------------------
#: **Who failed, stated once.** A verdict whose ``error_kind`` is in this set failed for a reason
#: outside the candidate: the model endpoint could not be reached or gave no usable answer after
#: the client's retries (``model_error``: connection refused or reset, client timeout, 408/429/5xx,
#: 401/403/404, an unreadable reply, no endpoint configured), the sandbox could not be set up or
#: died (``sandbox_error``, bubblewrap missing included), or the task's own scoring code raised
#: (``evaluator_error``, ``scoring_error``: a harness bug). Such a verdict is never a score: the
#: session retries the example, and if it still fails the cell ends ``incomplete`` and resumes
#: from its ledger. Every other kind is the candidate's (its program crashed, ran past its limit,
#: printed garbage; the endpoint refused its prompt as invalid, ``model_refused``, e.g. longer than
#: the context; the judge could not read a reply to its output, ``judge_error``) and scores 0. An
#: unknown kind (a plugin task's own) is the candidate's: a task names an infrastructure failure by
#: using one of these kinds.
INFRASTRUCTURE_ERROR_KINDS = frozenset({"model_error", "sandbox_error", "evaluator_error", "scoring_error"})


def is_infrastructure_failure(verdict: "Verdict") -> bool:
    """True when ``verdict`` records a failure of the harness or its infrastructure, not of the
    candidate (see :data:`INFRASTRUCTURE_ERROR_KINDS`)."""
    return not verdict.valid and verdict.error_kind in INFRASTRUCTURE_ERROR_KINDS


class InfrastructureFailure(HeldoutError):
    """The harness or its infrastructure (model endpoint, sandbox, disk) failed where a result was
    needed. Never a score: the session stops, the cell ends ``incomplete`` and ``--resume``
    finishes what is missing. Raised to an optimizer by ``evaluate``/``architect`` once the
    session has stopped this way."""


def mean_score(verdicts: Sequence[Verdict]) -> float:
    """The default ``aggregate``: the plain mean of the scores (0.0 for no verdicts)."""
    return sum(v.score for v in verdicts) / len(verdicts) if verdicts else 0.0


# -- the metric: its name, its direction, its aggregation --------------------------------------------
#: Aggregations a :class:`MetricSpec` can name and :meth:`MetricSpec.aggregate` computes; a task
#: with an aggregate of its own (VLIW's 147,734 / max cycles) names it in words and overrides
#: ``aggregate``.
def _median(values: Sequence[float]) -> float:
    # imported here for start-up time alone: statistics pulls in decimal, fractions and random,
    # and contracts loads with every `heldout` command (perf/cli_start.py)
    import statistics
    return statistics.median(values)


AGGREGATIONS: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": lambda values: sum(values) / len(values),  # bit for bit mean_score, so old records re-derive
    "median": _median, "min": min, "max": max}


@dataclass(frozen=True)
class MetricSpec:
    """What a task's score is: its ``name``, its direction and how a split's verdicts aggregate.

    **The direction rule, stated once:** every comparison, table, gate, plan and verdict sentence
    reads ``higher_is_better``; a cost (seconds, cycles, bytes) is declared lower-is-better and
    never negated by hand. ``failure_score`` is what an invalid verdict (score 0.0 by the validity
    rule) counts as in the aggregate and in every comparison: 0.0 for a higher-is-better metric
    (the rule as it stands); a lower-is-better one must state it, because a cost of 0 is the best
    there is and a candidate that crashes on purpose would otherwise win."""

    name: str
    higher_is_better: bool = True
    aggregation: str = "mean"
    failure_score: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a metric is named by a non-empty string, got {self.name!r}")
        if type(self.higher_is_better) is not bool:
            raise ValueError(f"higher_is_better is True or False, got {self.higher_is_better!r}")
        if not isinstance(self.aggregation, str) or not self.aggregation.strip():
            raise ValueError(f"a metric's aggregation is named by a non-empty string, got {self.aggregation!r}")
        if self.failure_score is None and not self.higher_is_better:
            raise ValueError(f"metric {self.name!r} is lower-is-better: state failure_score, the cost an invalid "
                             "verdict counts as (its score 0.0 would be the best cost there is)")
        if self.failure_score is not None and (isinstance(self.failure_score, bool) or not isinstance(
                self.failure_score, (int, float)) or not math.isfinite(self.failure_score)):
            raise ValueError(f"failure_score must be a finite number, got {self.failure_score!r}")

    @classmethod
    def of(cls, metric: "MetricSpec | str") -> "MetricSpec":
        """A task's ``metric`` attribute as a spec: a plain string names a higher-is-better mean
        (how tasks declared their metric before directions existed)."""
        if isinstance(metric, MetricSpec):
            return metric
        if isinstance(metric, str):
            return cls(metric)
        raise ValueError(f"a task's metric is a MetricSpec or its name, got {type(metric).__name__}")

    @property
    def sign(self) -> int:
        """+1 when higher is better, -1 when lower is: ``sign * (b - a) > 0`` says b is better."""
        return 1 if self.higher_is_better else -1

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    def reading(self, verdict: Verdict) -> float:
        """The value ``verdict`` counts as: its score, or ``failure_score`` when it is invalid."""
        return verdict.score if verdict.valid else float(self.failure_score or 0.0)

    def aggregate(self, verdicts: Sequence[Verdict]) -> float:
        """The named aggregation of the verdicts' readings (0.0 for no verdicts)."""
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"metric {self.name!r} aggregates by {self.aggregation!r}, which only its task "
                             f"computes (named aggregations: {', '.join(AGGREGATIONS)})")
        return float(AGGREGATIONS[self.aggregation]([self.reading(v) for v in verdicts])) if verdicts else 0.0

    def record_fields(self) -> dict[str, Any]:
        """The spec as a run record states it (``metric`` stays the name, as before directions)."""
        return {"metric": self.name, "higher_is_better": self.higher_is_better, "aggregation": self.aggregation,
                "failure_score": self.failure_score}

    @classmethod
    def from_record(cls, fields: Mapping[str, Any]) -> "MetricSpec":
        """The spec a run record states; a record from before directions reads higher-is-better."""
        return cls(str(fields.get("metric") or "score"), bool(fields.get("higher_is_better", True)),
                   str(fields.get("aggregation") or "mean"), fields.get("failure_score"))


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant"]
    content: str


# The wall backstop of a CPU limit: a program that computes gets its CPU limit whatever the load
# (its wall time is its CPU time stretched by the load: ~4.5x beside 8 other runs on 2 cores), and
# one that sleeps or blocks ends here. Generous on purpose: at 4x + 2 s a call that uses its whole
# limit survives a 4x stretch, and a correct MBPP+ solution (about a quarter of its limit) 16x.
WALL_BACKSTOP_FACTOR = 4.0
WALL_BACKSTOP_SECONDS = 2.0


def wall_backstop(cpu_seconds: float) -> float:
    """The wall time after which a program with a CPU limit of ``cpu_seconds`` is stopped anyway
    (it sleeps, blocks on I/O or waits): the whole run's ``wall_seconds`` a task sets, and each
    call's backstop of ``per_call_seconds``."""
    return WALL_BACKSTOP_FACTOR * cpu_seconds + WALL_BACKSTOP_SECONDS


@dataclass(frozen=True)
class RunLimits:
    """Resource limits for one sandboxed execution; per task, overridable, printed in verdicts.
    Rule (DESIGN "Time"): a program's time limit is ``cpu_seconds``, so its verdict does not
    depend on the machine's load; ``wall_seconds`` only stops a program that waits, and a program
    task's is at least :func:`wall_backstop` of its CPU limit (checked when the task registers)."""

    wall_seconds: float = 30.0
    cpu_seconds: float = 30.0
    memory_mb: int = 2048
    max_processes: int = 64
    max_file_mb: int = 16
    max_open_files: int = 256
    max_output_bytes: int = 4 * 1024 * 1024
    scratch_mb: int = 64  # the private writable scratch (a tmpfs): a total quota, not per file

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


# -- the worker ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Completion:
    """One worker answer: its text and what it cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    cached: bool = False


@runtime_checkable
class Worker(Protocol):
    """The frozen model that executes prompt candidates, as a task sees it.

    Rule: one ``complete`` call is one metric call; the harness meters and ledgers it. It raises
    (a ``HeldoutError`` subclass) when the model cannot answer; the task turns that into a
    ``model_error`` verdict for that example."""

    model: str

    def complete(self, messages: Sequence[Message]) -> Completion: ...


@dataclass(frozen=True)
class RunContext:
    """What the harness hands every task's run/score call: the resource limits, the metered
    worker (None when the session has none: a task that needs one returns a ``model_error``
    verdict), the metered judge model when the session has a separate one, and the task options (e.g. a tolerance) that are part of the experiment's
    description. Built by the harness, never by a candidate."""

    limits: RunLimits = RunLimits()
    worker: Worker | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    judge: Worker | None = None  # a separate metered judge model (model-judge verifiers); None: use worker

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)


# -- tasks ---------------------------------------------------------------------------------------------
@runtime_checkable
class PromptTask(Protocol):
    """A task's definition (its benchmark) when its candidate is a prompt: the worker turns
    ``render``'s messages into text, and ``score_text`` scores that text. ``score_text`` never
    raises (a verdict carries the error)."""

    name: str
    kind: TaskKind

    def seed_candidate(self) -> Candidate: ...
    def render(self, candidate: Candidate, example: Example, context: RunContext) -> list[Message]: ...
    def score_text(self, text: str, example: Example, context: RunContext) -> Verdict: ...
    def aggregate(self, verdicts: Sequence[Verdict]) -> float: ...


@runtime_checkable
class ProgramTask(Protocol):
    """A task's definition (its benchmark) when its candidate is code (or SQL): ``run`` executes
    it on one example in the sandbox and scores what it produced. ``run`` never raises for a bad
    candidate."""

    name: str
    kind: TaskKind

    def seed_candidate(self) -> Candidate: ...
    def run(self, candidate: Candidate, example: Example, context: RunContext) -> Verdict: ...
    def aggregate(self, verdicts: Sequence[Verdict]) -> float: ...


@runtime_checkable
class Verifier(Protocol):
    """What the optimizer is shown of a verdict: the task's scoring rule plus the feedback let through.

    Rule: a verifier changes only what the *optimizer sees*. The canonical verifier
    (``name == "decomposed"``) passes the task's verdict through; a variant returns a new verdict
    derived from it (a scalar, a coarse score, ...). Held-out results are always scored with the
    canonical verifier, whatever variant an optimisation ran under. ``repeats`` > 1 asks the
    harness to score that many times and pass all the verdicts (for stochastic scorers)."""

    name: str
    repeats: int

    def show(self, verdicts: Sequence[Verdict], example: Example) -> Verdict: ...


# -- the optimizer's side --------------------------------------------------------------------------------
@runtime_checkable
class TaskView(Protocol):
    """Everything an optimizer may see of a task, and nothing else. Implemented in-process by the
    session's view and, for isolated optimizers, by :class:`heldout.adapters.client.TaskClient`
    over HTTP: the same names, the same errors, the same architect call.

    * ``train``: dicts with ``id``, ``input``, ``target``; ``val``: ``id`` and ``input`` only;
      test examples are never reachable.
    * ``evaluate(candidate, split, ids)`` returns one dict per example with the fields the
      visibility policy shows; raises :class:`BudgetExceeded` (nothing ran) or
      :class:`VisibilityError`. ``split`` must be exactly ``"train"`` or ``"val"``.
    * ``architect(messages, ...)`` is one metered call of the session's architect model;
      ``architect_tokens_used`` the architect tokens spent so far.
    * ``record_event(kind, **data)`` writes mechanism evidence (e.g. ``merge_attempt``) to the
      ledger; it costs no budget.
    * ``remaining`` / ``metric_calls_budget``: metric calls left / in all; ``policy`` and
      ``verifier`` name the visibility policy and the verifier variant in force.
    * ``metric``: the task's :class:`MetricSpec`. **The direction rule for optimizers:** a result's
      ``score`` is the metric's reading (an invalid verdict shows ``metric.failure_score``), and
      every comparison an optimizer makes reads ``metric.higher_is_better``: ``metric.sign *
      score`` is higher-is-better on every task, so a search that maximises it lowers a cost.

    The in-process view (:class:`heldout.evaluators.view.SessionView`) holds no test example,
    and neither does anything that refers to it, until the session has scored the final candidate.
    """

    task_name: str
    description: str
    kind: str
    policy: str
    verifier: str
    seed_candidate: Candidate
    train: list[dict[str, Any]]
    val: list[dict[str, Any]]
    metric: MetricSpec

    @property
    def remaining(self) -> int: ...
    @property
    def metric_calls_budget(self) -> int: ...
    @property
    def architect_tokens_used(self) -> int: ...

    def evaluate(self, candidate: Candidate, split: str = "train", ids: Sequence[str] | None = None,
                 parent: str | None = None) -> list[dict[str, Any]]: ...
    def architect(self, messages: Sequence[Mapping[str, str]], *, temperature: float = 1.0,
                  max_tokens: int | None = None, replicate: int = 0) -> str: ...
    def record_event(self, kind: str, **data: Any) -> None: ...


Optimizer = Callable[[TaskView, int], Candidate]
"""An optimizer is ``optimize(view, seed) -> Candidate``. It may raise :class:`BudgetExceeded`
out of ``evaluate`` when it overruns; the harness then scores its best candidate so far only if
the optimizer returned one, so a careful optimizer catches it and returns its best."""


__all__ = [
    "SPLITS", "BudgetExceeded", "Candidate", "Completion", "DataError", "Example",
    "HeldoutError", "INFRASTRUCTURE_ERROR_KINDS", "MetricSpec", "InfrastructureFailure", "MalformedCandidate", "Message", "Optimizer", "ProgramTask", "PromptTask",
    "RunContext", "RunLimits", "Source", "TaskKind", "TaskView", "Verdict", "Verifier",
    "VisibilityError", "Worker", "candidate_id", "canonical_json", "check_candidate", "is_infrastructure_failure", "mean_score",
    "sha256_text",
]
