"""The model-judge verifier: a rubric of named dimensions, scored by a judge model.

* :class:`Rubric` names the dimensions (each with a description and a weight) and the integer
  scale ``0 .. max_points``.
* :func:`judge_messages` writes the judge request: the rubric and the reply format in the system
  message (with the marker line :data:`JUDGE_MARKER`), the question, the reference answer (when
  there is one) and the answer to judge in the user message, in that order.
* :func:`parse_judgement` reads the reply **strictly**: the whole reply is one JSON object
  ``{"scores": {<dimension>: {"score": <int>, "reason": <non-empty text>}}}`` holding every
  rubric dimension exactly once and nothing else; anything else raises :class:`JudgeReplyError`
  with a one-line reason. A judge that rambles around its JSON is a broken scorer, not a score.
* :class:`ModelJudge` turns one (example, answer) into a :class:`Verdict`: ``dimensions`` are the
  per-dimension scores on [0, 1] (points / max_points), ``score`` their weighted mean, and the
  feedback lists every dimension's points and reason. A malformed reply is a ``judge_error``
  verdict (invalid, score 0, the reason in ``error``), a failed judge call a ``model_error`` one.

The judge model is reached through the :class:`RunContext`: ``context.judge`` (a separate judge
endpoint the session was given, ``SessionModels(judge=ModelClient(...))``) or else ``context.worker``.
Both are the session's metered workers, so every judge call is counted on the session's token
channels (``judge-*`` for a separate judge) and appended to the ledger as a ``worker_call``; the
metric call it belongs to is the evaluation's, already admitted by the session.

:class:`JudgedTask` makes any prompt task judge-scored: as its canonical verifier
(``canonical="judge"``; the task's own rule stays available to optimisation as the verifier
variant ``tests:rule``) or as a variant (``canonical="rule"``; ``tests:judge`` optimises against
the judge while held-out results keep the task's rule). User JSONL tasks take the answer format
``judge`` (:mod:`heldout.benchmarks.user_jsonl`) for the same with :data:`DEFAULT_RUBRIC`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from heldout.benchmarks.base import Benchmark
from heldout.contracts import (Candidate, Example, HeldoutError, Message, RunContext, Verdict, Worker)
from heldout.models import model_failure_kind

if TYPE_CHECKING:  # annotations only: loading imports the registry, which imports the JSONL tasks (and so this)
    from heldout.benchmarks.loading import Task

JUDGE_MARKER = "Protocol: heldout-judge/1"
"""A line of every judge request's system message (the loopback test model keys its judge rule on it)."""

SCORER_OPTION = "scorer"  # the task option that picks the judge or the task's rule for one scoring
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class JudgeReplyError(HeldoutError):
    """A judge reply that is not the strict JSON verdict of the rubric."""


class RubricError(HeldoutError):
    """A rubric that cannot be used (no dimensions, a bad name, a repeated name, a bad weight)."""


@dataclass(frozen=True)
class Dimension:
    """One named lever of a rubric. ``name`` is an identifier; ``weight`` > 0."""

    name: str
    description: str
    weight: float = 1.0


@dataclass(frozen=True)
class Rubric:
    """Named dimensions on an integer scale ``0 .. max_points``. Checked on construction."""

    name: str
    dimensions: tuple[Dimension, ...]
    max_points: int = 5

    def __post_init__(self) -> None:
        if not self.dimensions:
            raise RubricError(f"rubric {self.name!r} has no dimensions")
        names = [d.name for d in self.dimensions]
        bad = [n for n in names if not isinstance(n, str) or not _NAME.match(n)]
        if bad:
            raise RubricError(f"rubric {self.name!r}: dimension names must be identifiers, got {bad}")
        if len(set(names)) != len(names):
            raise RubricError(f"rubric {self.name!r} repeats a dimension name: {names}")
        if any(not (isinstance(d.weight, (int, float)) and math.isfinite(d.weight) and d.weight > 0)
               for d in self.dimensions):
            raise RubricError(f"rubric {self.name!r}: weights must be positive finite numbers")
        if type(self.max_points) is not int or self.max_points < 1:
            raise RubricError(f"rubric {self.name!r}: max_points must be an integer >= 1")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Rubric":
        try:
            return cls(name=str(data["name"]), max_points=data.get("max_points", 5),
                       dimensions=tuple(Dimension(d["name"], str(d.get("description", "")), d.get("weight", 1.0))
                                        for d in data["dimensions"]))
        except (KeyError, TypeError) as exc:
            raise RubricError(f"a rubric is {{name, dimensions: [{{name, description[, weight]}}][, max_points]}}: "
                              f"{type(exc).__name__}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


DEFAULT_RUBRIC = Rubric("answer-quality", (
    Dimension("correctness", "the answer agrees with the reference answer (when one is given) and is true", 2.0),
    Dimension("completeness", "the answer addresses everything the question asks"),
    Dimension("clarity", "the final answer is stated plainly and can be found without guessing"),
))


@dataclass(frozen=True)
class DimensionScore:
    name: str
    points: int
    reason: str


def judge_messages(rubric: Rubric, question: str, answer: str, reference: str | None = None) -> list[Message]:
    """The judge request (see the module docstring); the answer comes last."""
    dims = "\n".join(f"- {d.name}: {d.description}" for d in rubric.dimensions)
    shape = ", ".join(f'"{d.name}": {{"score": <integer>, "reason": "<one sentence>"}}' for d in rubric.dimensions)
    system = (f"You are a strict grader. Score the answer on every dimension of the rubric.\n{JUDGE_MARKER}\n"
              f"Rubric: {rubric.name}\nScale: 0 to {rubric.max_points}\nDimensions:\n{dims}\n\n"
              f"Reply with exactly one JSON object and nothing else: {{\"scores\": {{{shape}}}}}")
    parts = [f"Question:\n{question.strip()}"]
    if reference is not None:
        parts.append(f"Reference answer:\n{str(reference).strip()}")
    parts.append(f"Answer to judge:\n{answer.strip()}")
    return [Message("system", system), Message("user", "\n\n".join(parts))]


def parse_judgement(text: str, rubric: Rubric) -> list[DimensionScore]:
    """The per-dimension scores of a judge reply, in rubric order; raises :class:`JudgeReplyError`."""
    if not isinstance(text, str):
        raise JudgeReplyError(f"judge reply is {type(text).__name__}, not text")
    try:
        data = json.loads(text.strip(), parse_constant=_refuse_constant)
    except ValueError as exc:
        raise JudgeReplyError(f"judge reply is not one JSON object ({exc}): {text.strip()[:120]!r}") from None
    if not isinstance(data, dict) or set(data) != {"scores"} or not isinstance(data["scores"], dict):
        raise JudgeReplyError(f"judge reply must be {{\"scores\": {{...}}}} and nothing else, got keys "
                              f"{sorted(data) if isinstance(data, dict) else type(data).__name__}")
    scores = data["scores"]
    wanted = [d.name for d in rubric.dimensions]
    missing, extra = [n for n in wanted if n not in scores], sorted(set(scores) - set(wanted))
    if missing or extra:
        raise JudgeReplyError(f"judge reply must score exactly the rubric's dimensions: missing {missing}, "
                              f"unknown {extra}")
    out = []
    for name in wanted:
        entry = scores[name]
        if not isinstance(entry, dict) or set(entry) != {"score", "reason"}:
            raise JudgeReplyError(f"judge reply: {name!r} must be {{\"score\", \"reason\"}}, got {entry!r:.120}")
        points, reason = entry["score"], entry["reason"]
        if type(points) is not int or not 0 <= points <= rubric.max_points:
            raise JudgeReplyError(f"judge reply: {name!r} score must be an integer 0..{rubric.max_points}, "
                                  f"got {points!r}")
        if not isinstance(reason, str) or not reason.strip():
            raise JudgeReplyError(f"judge reply: {name!r} needs a non-empty reason")
        out.append(DimensionScore(name, points, reason.strip()))
    return out


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a score")


def judgement_verdict(example_id: str, rubric: Rubric, scores: Sequence[DimensionScore],
                      output: Any = None) -> Verdict:
    """Per-dimension scores on [0, 1] as dimensions, their weighted mean as the score."""
    weights = {d.name: float(d.weight) for d in rubric.dimensions}
    dims = {s.name: s.points / rubric.max_points for s in scores}
    score = sum(weights[n] * v for n, v in dims.items()) / sum(weights.values())
    feedback = "\n".join(f"{s.name}: {s.points}/{rubric.max_points} - {s.reason}" for s in scores)
    return Verdict(example_id=example_id, score=score, valid=True, dimensions=dims,
                   feedback=f"judge ({rubric.name}): {score:.3f}\n{feedback}", output=output)


@dataclass(frozen=True)
class ModelJudge:
    """Scores answers with a judge model through the run context (see the module docstring)."""

    rubric: Rubric = DEFAULT_RUBRIC

    def score(self, example: Example, question: str, answer: str, context: RunContext,
              reference: str | None = None) -> Verdict:
        judge: Worker | None = context.judge or context.worker
        if judge is None:
            return Verdict.failure(example.id, "the model judge needs a judge or worker model in the session",
                                   "model_error")
        try:
            reply = judge.complete(judge_messages(self.rubric, question, answer, reference))
        except HeldoutError as exc:  # a refused request (the answer too long) is the candidate's
            return Verdict.failure(example.id, f"judge call failed: {exc}", model_failure_kind(exc))
        try:
            scores = parse_judgement(reply.text, self.rubric)
        except JudgeReplyError as exc:
            return Verdict.failure(example.id, f"malformed judge reply: {exc}", "judge_error",
                                   output={"answer": answer, "judge_reply": reply.text[:2000]})
        return judgement_verdict(example.id, self.rubric, scores,
                                 output={"answer": answer, "judge": {s.name: asdict(s) for s in scores}})


class JudgedTask(Benchmark):
    """A prompt task scored by a model judge: as its canonical verifier (``canonical="judge"``,
    variant ``tests:rule`` = the task's own rule) or as a variant only (``canonical="rule"``,
    variant ``tests:judge``). Data, prompts and the seed are the wrapped task's; ``name`` must
    have a manifest (default: the wrapped task's name, which this then replaces in a session)."""

    kind = "prompt"
    default_component = "instruction"

    def __init__(self, inner: Benchmark, rubric: Rubric = DEFAULT_RUBRIC, *, canonical: str = "judge",
                 name: str | None = None, reference_field: str | None = None) -> None:
        if canonical not in ("judge", "rule"):
            raise RubricError(f"canonical must be 'judge' or 'rule', got {canonical!r}")
        if inner.kind != "prompt":
            raise RubricError(f"{inner.name} is a program task: a model judge scores prompt answers")
        self.inner = inner
        self.judge = ModelJudge(rubric)
        self.canonical = canonical
        self.reference_field = reference_field
        self.name = name or inner.name
        self.family = inner.family
        self.version = inner.version
        self.source = inner.source
        self.default_limits = inner.default_limits
        self.metric = f"judge {rubric.name} (weighted mean of {len(rubric.dimensions)} dimensions)" \
            if canonical == "judge" else inner.metric
        self.description = f"{inner.description} [scored by a model judge, rubric {rubric.name}]"
        self.verifier_options = {**inner.verifier_options,
                                 ("rule" if canonical == "judge" else "judge"): {SCORER_OPTION: (
                                     "rule" if canonical == "judge" else "judge")}}

    def load_raw(self, data_dir: str | None) -> list[Example]:
        return self.inner.load_raw(data_dir)

    def seed_candidate(self) -> Candidate:
        return self.inner.seed_candidate()

    def render(self, candidate: Candidate, example: Example, context: RunContext | None = None) -> list[Message]:
        return self.inner.render(candidate, example, context)

    def aggregate(self, verdicts: list[Verdict]) -> float:
        return self.inner.aggregate(verdicts) if self.canonical == "rule" else super().aggregate(verdicts)

    def reference(self, example: Example) -> str | None:
        target = example.target
        if self.reference_field is not None and isinstance(target, Mapping):
            target = target.get(self.reference_field)
        return None if target is None else str(target)

    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        context = context or self.context()
        if context.option(SCORER_OPTION, self.canonical) == "rule":
            return self.inner.score_text(text, example, context)
        question = self.inner.format_input(example) if hasattr(self.inner, "format_input") else str(example.input)
        return self.judge.score(example, question, text if isinstance(text, str) else "", context,
                                self.reference(example))


def judged(task: Task, rubric: Rubric = DEFAULT_RUBRIC, *, canonical: str = "judge",
           reference_field: str | None = None) -> Task:
    """``task`` (loaded, verified) with its benchmark wrapped in a :class:`JudgedTask`; pass it to
    ``Session(task, ...)``."""
    return replace(task, benchmark=JudgedTask(task.benchmark, rubric, canonical=canonical,
                                              reference_field=reference_field))


__all__ = ["DEFAULT_RUBRIC", "JUDGE_MARKER", "SCORER_OPTION", "Dimension", "DimensionScore", "JudgeReplyError",
           "JudgedTask", "ModelJudge", "Rubric", "RubricError", "judge_messages", "judged", "judgement_verdict",
           "parse_judgement"]
