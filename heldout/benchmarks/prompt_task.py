"""The shared shape of prompt tasks (dataset benchmarks): data / prompting / metric kept apart.

* data: ``read_mirror(data_dir)`` and ``read_hub()`` return source rows; ``to_examples(rows)``
  turns them into :class:`Example` records (the same records from either source);
* prompting: ``render`` puts the candidate's ``instruction`` in the system message and the
  example, formatted by ``format_input``, in the user message, followed by the task's fixed
  answer-format line (so that extraction does not depend on the optimizer remembering it);
* metric: ``score_text`` extracts the answer in every named mode and scores it.
"""

from __future__ import annotations

from typing import Any

from heldout.contracts import Candidate, Example, Message, RunContext, Verdict, check_candidate
from heldout.benchmarks.base import Benchmark

SEED_INSTRUCTION = (
    "Read the problem carefully and make sure you understand what is being asked. "
    "Then reason through it step by step, checking each step. "
    "Finally, give your answer on the last line in the form: So the answer is <answer>."
)
"""Task-agnostic seed prompt (understand / reason / answer), the starting point of every prompt
task; optimizers rewrite it."""


class PromptBenchmark(Benchmark):
    kind = "prompt"
    default_component = "instruction"
    answer_format = "Finish with: So the answer is <answer>."

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

    def render(self, candidate: Candidate, example: Example, context: RunContext | None = None) -> list[Message]:
        """System: the candidate's instruction (plus any other components, labelled, in name
        order); user: the example and the fixed answer-format line."""
        check_candidate(candidate)
        parts = [candidate.get("instruction", "")]
        parts += [f"## {name}\n{text}" for name, text in sorted(candidate.items()) if name != "instruction"]
        system = "\n\n".join(p for p in parts if p)
        return [Message("system", system),
                Message("user", f"{self.format_input(example)}\n\n{self.answer_format}")]

    # -- metric -----------------------------------------------------------------------------
    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        raise NotImplementedError


def mode_verdict(example: Example, scored: dict[str, Any], primary: str = "flexible",
                 text: str = "", target_for_feedback: Any = None) -> Verdict:
    """A verdict from a scorer's per-mode dict ``{"strict": 0/1, "flexible": 0/1,
    "extracted_strict": ..., "extracted_flexible": ...}``: both modes reported side by side as
    dimensions, ``primary`` as the score."""
    dims = {k: float(v) for k, v in scored.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and not k.startswith("extracted")}
    dims.update({k: float(v) for k, v in scored.items() if isinstance(v, bool)})
    extracted = scored.get(f"extracted_{primary}")
    target = example.target if target_for_feedback is None else target_for_feedback
    if extracted is None:
        feedback = f"no answer could be extracted ({primary} mode); expected {target!r}"
    elif dims.get(primary, 0.0) >= 1.0:
        feedback = f"correct: {extracted!r}"
    else:
        feedback = f"wrong: extracted {extracted!r}, expected {target!r}"
    return Verdict(example_id=example.id, score=dims.get(primary, 0.0), valid=True, dimensions=dims,
                   feedback=feedback, output={"text": text,
                                              **{k: v for k, v in scored.items() if k.startswith("extracted")}})
