"""The shared shape of prompt tasks (dataset benchmarks): data / prompting / metric kept apart,
and the ONE verdict builder every prompt task uses.

* data: ``read_mirror(data_dir)`` and ``read_hub()`` return source rows; ``to_examples(rows)``
  turns them into :class:`Example` records (the same records from either source);
* prompting: ``render`` puts the candidate's ``instruction`` in the system message and the
  example in the user message. The *prompt format* (a task option, ``options["prompt_format"]``,
  recorded in the run record) says how: ``zero_shot`` (the default) is the example formatted by
  ``format_input`` followed by the task's fixed answer-format line (so extraction does not depend
  on the optimizer remembering it); families add few-shot formats that reproduce a published
  setting byte for byte (BBH ``cot_3shot``, MMLU-Pro ``cot_5shot``). Each format is a
  :class:`PromptSetting`, which also says how the prompt is sent: as a chat, or, where the
  reference sends a completion to a base model, as a completion (the prompt bytes alone);
* metric: ``score_text`` reads the answer in every mode and returns :func:`prompt_verdict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from heldout.benchmarks.base import Benchmark
from heldout.benchmarks.extraction import EXTRACTION_MODES, HEADLINE_MODE, MAX_OUTPUT_CHARS, sanitize_text
from heldout.contracts import Candidate, Example, HeldoutError, Message, RunContext, Verdict, check_candidate

SEED_INSTRUCTION = (
    "Read the problem carefully and make sure you understand what is being asked. "
    "Then reason through it step by step, checking each step. "
    "Finally, give your answer on the last line in the form: So the answer is <answer>."
)
"""Task-agnostic seed prompt (understand / reason / answer), the starting point of every prompt
task whose answer is a short string; optimizers rewrite it. (MBPP+ has its own: code, not a line.)"""

ZERO_SHOT = "zero_shot"

CHAT = "chat"
COMPLETION = "completion"
SENT_AS = {
    CHAT: "chat: the candidate's instruction as the system message (none when it is empty), the prompt as "
          "one user message, to /chat/completions",
    COMPLETION: "completion: the prompt bytes alone to /completions (no system message, no chat template); "
                "a non-empty instruction goes before them, followed by a blank line",
}
"""How a setting's prompt travels, by name: the two OpenAI endpoints."""


@dataclass(frozen=True)
class PromptSetting:
    """Everything a number measured in one prompt format depends on, named, so that a run
    record says which published setting it reproduces (or that it is heldout's own).

    Rule: a worker request in this format is sent with exactly ``stop``, and with ``max_tokens``
    and ``temperature`` unless the run's options set them (the record then says so); the prompt
    bytes are those of ``template``; ``sent_as`` says how they travel (:data:`SENT_AS`): as a chat,
    or as a completion, as the reference sends them to a base model (lm-evaluation-harness's
    ``generate_until``, vLLM's ``generate``), so that with no instruction the endpoint receives
    exactly the reference bytes."""

    name: str
    reference: str  # the published setting it reproduces, or that it is heldout's own
    shots: int
    template: str  # where the prompt bytes come from
    sent_as: str = CHAT  # CHAT or COMPLETION
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.sent_as not in SENT_AS:
            raise ValueError(f"PromptSetting.sent_as must be one of {sorted(SENT_AS)}, got {self.sent_as!r}")

    def request_fields(self, messages: Sequence[Message]) -> dict[str, Any]:
        """The request fields the rendered ``messages`` travel in: ``{"messages": ...}`` for a
        chat; ``{"prompt": ...}`` for a completion, the contents joined by a blank line, so with
        no instruction the prompt is the user message alone: the reference bytes."""
        if self.sent_as == COMPLETION:
            return {"prompt": "\n\n".join(m.content for m in messages)}
        return {"messages": tuple({"role": m.role, "content": m.content} for m in messages)}

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reference": self.reference, "shots": self.shots, "template": self.template,
                "sent_as": self.sent_as, "stop": list(self.stop), "max_tokens": self.max_tokens,
                "temperature": self.temperature}


ZERO_SHOT_SETTING = PromptSetting(
    ZERO_SHOT, "heldout's own zero-shot setting (not comparable with published few-shot numbers)", 0,
    "the example formatted by the task, then its answer-format line", CHAT)


class UnknownPromptFormat(HeldoutError, ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# The verdict of a prompt task
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scored:
    """What a task's scorer made of one (sanitised) output.

    ``dimensions``: every named sub-score (each mode, plus family extras); ``headline``: the
    dimension that is the verdict's score; ``answer``: what was read (None: no answer found, and
    ``why`` says why); ``expected``: what the feedback names as right; ``detail``: more feedback
    lines (a failing test ...); ``output``: extra fields kept in the verdict's output."""

    dimensions: dict[str, float]
    headline: str
    answer: Any
    expected: Any = None
    why: str | None = None
    detail: str = ""
    output: dict[str, Any] = field(default_factory=dict)
    shown: str | None = None  # how feedback names the answer (default: its repr)


_WHY = {
    "no_output": "the output is empty",
    "empty": "the output is empty",
    "no_cue": "no answer cue such as 'So the answer is X.'",
    "negated": "the final answer cue is negated ('the answer is not X')",
    "hedged": "the final answer offers more than one answer ('(A) or (B)')",
    "unreadable": "the text after the final answer cue is not an answer of this task's form",
    "too_large": "the number is too large for a float",
    "no_code": "no Python code",
}


def prompt_verdict(example_id: str, text: Any, score: Callable[[str], Scored]) -> Verdict:
    """THE verdict of a prompt task for one model output (every prompt task builds it here).

    Validity rule: ``valid=False`` is reserved for failures to produce an output at all or to
    score it: no text (``None``, a non-text value: ``no_output``; a worker that failed is turned
    into ``model_error`` / ``timeout`` / ``crash`` by the session before this is reached) and a
    scorer that crashed (``scoring_error``: a data or harness bug, not the model's). Everything
    the model actually said is *valid*: an output with no extractable answer (no cue, a hedge, a
    negated cue, code that does not run) scores 0 with feedback saying why; an output longer than
    :data:`~heldout.benchmarks.extraction.MAX_OUTPUT_CHARS` is not read and scores 0 with
    feedback saying so. ``bytes`` are decoded; surrogates and control characters are replaced or
    dropped (:func:`~heldout.benchmarks.extraction.sanitize_text`), so the verdict always
    serialises. ``score`` is the ``headline`` dimension; every dimension is reported."""
    clean = sanitize_text(text)
    if clean is None:
        return Verdict.failure(example_id, f"model output is {type(text).__name__}, not text", "no_output")
    too_long = len(clean) > MAX_OUTPUT_CHARS
    try:
        scored = score("" if too_long else clean)
        dims = {k: float(v) for k, v in scored.dimensions.items()}
        value = dims[scored.headline]
    except Exception as exc:  # noqa: BLE001 - one bad example never stops a run
        return Verdict.failure(example_id, f"scoring failed: {type(exc).__name__}: {exc}", "scoring_error")
    output = {"text": clean[:MAX_OUTPUT_CHARS], "answer": scored.answer, **scored.output}
    if too_long:
        dims = {k: 0.0 for k in dims}
        feedback = (f"the output is {len(clean):,} characters, over the cap of {MAX_OUTPUT_CHARS:,}: "
                    "not read, scored 0")
        return Verdict(example_id=example_id, score=0.0, dimensions=dims, feedback=feedback,
                       output={**output, "answer": None, "why": "too_long"})
    if scored.answer is None:
        feedback = f"no answer found: {_WHY.get(scored.why or '', scored.why or 'nothing readable')}"
        if scored.expected is not None:
            feedback += f"; expected {scored.expected!r}"
    else:
        shown = scored.shown or repr(scored.answer)
        expected = f", expected {scored.expected!r}" if scored.expected is not None else ""
        if value >= 1.0:
            feedback = f"correct: {shown}"
        elif value > 0.0:
            feedback = f"partly correct ({value:.3g}): {shown}{expected}"
        else:
            feedback = f"wrong: {shown}{expected}"
        if scored.why in _WHY:
            feedback += f" ({_WHY[scored.why]})"
    others = ", ".join(f"{k} {dims[k]:g}" for k in EXTRACTION_MODES if k in dims and k != scored.headline)
    if others:
        feedback += f" [{scored.headline} {value:g}; {others}]"
    if scored.detail:
        feedback += "\n" + scored.detail
    return Verdict(example_id=example_id, score=value, dimensions=dims, feedback=feedback,
                   output={**output, "why": scored.why})


def modes_scored(result: Mapping[str, Any], expected: Any, *, headline: str = HEADLINE_MODE,
                 metric: str | None = None) -> Scored:
    """A :class:`Scored` from an extraction scorer's dict (``score_bbh`` ...): every numeric entry
    is a dimension, ``metric`` (default: the headline mode) is the score, the headline mode's
    reading is the answer, every mode's reading is kept in the output."""
    dims = {k: float(v) for k, v in result.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith(("extracted_", "why_"))}
    readings = {k: v for k, v in result.items() if k.startswith("extracted_")}
    why = result.get(f"why_{headline}")
    if result.get("why_strict") in _SPECIFIC_WHY:  # the strict reading knows best why nothing was read
        why = result["why_strict"]
    return Scored(dimensions=dims, headline=metric or headline, answer=result.get(f"extracted_{headline}"),
                  expected=expected, why=why, output=readings)


_SPECIFIC_WHY = ("hedged", "negated", "empty", "no_output")


# ---------------------------------------------------------------------------------------------
# Prompt benchmarks
# ---------------------------------------------------------------------------------------------


class PromptBenchmark(Benchmark):
    kind = "prompt"
    default_component = "instruction"
    answer_format = "Finish with: So the answer is <answer>."
    prompt_formats: tuple[str, ...] = (ZERO_SHOT,)
    """The named prompt formats of the task (``options["prompt_format"]``); the first is the default."""

    # -- data -------------------------------------------------------------------------------
    def load_raw(self, data_dir: str | None) -> list[Example]:
        rows = self.read_mirror(data_dir) if data_dir else self.read_hub()
        return self.to_examples(rows)

    def read_mirror(self, data_dir: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def read_hub(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def to_examples(self, rows: list[dict[str, Any]]) -> list[Example]:
        raise NotImplementedError

    # -- prompting --------------------------------------------------------------------------
    def seed_candidate(self) -> Candidate:
        return {"instruction": SEED_INSTRUCTION}

    def format_input(self, example: Example) -> str:
        raise NotImplementedError

    def check_prompt_format(self, prompt_format: str | None) -> str:
        """The prompt format to use (None: the default); raises :class:`UnknownPromptFormat`."""
        chosen = prompt_format or self.prompt_formats[0]
        if chosen not in self.prompt_formats:
            raise UnknownPromptFormat(f"{self.name} has no prompt format {chosen!r}; it has: "
                                      f"{', '.join(self.prompt_formats)}")
        return chosen

    def prompt_setting(self, prompt_format: str | None = None) -> PromptSetting:
        """The setting of ``prompt_format`` (None: the default); families with published
        few-shot formats name theirs."""
        self.check_prompt_format(prompt_format)
        return ZERO_SHOT_SETTING

    def user_message(self, example: Example, prompt_format: str) -> str:
        """The user message of ``example`` in ``prompt_format`` (families add few-shot formats)."""
        return f"{self.format_input(example)}\n\n{self.answer_format}"

    def render(self, candidate: Candidate, example: Example, context: RunContext | None = None) -> list[Message]:
        """System: the candidate's instruction (plus any other components, labelled, in name
        order); user: the example in the prompt format ``context.options["prompt_format"]``."""
        check_candidate(candidate)
        chosen = self.check_prompt_format(context.option("prompt_format") if context is not None else None)
        parts = [candidate.get("instruction", "")]
        parts += [f"## {name}\n{text}" for name, text in sorted(candidate.items()) if name != "instruction"]
        system = "\n\n".join(p for p in parts if p)
        user = Message("user", self.user_message(example, chosen))
        # an empty instruction sends no system message: a published setting that has none is sent as it is
        return [Message("system", system), user] if system else [user]

    # -- metric -----------------------------------------------------------------------------
    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        raise NotImplementedError
