"""GSM-Hard: GSM8K questions with one number replaced by a large one (PAL, Gao et al. 2023).

Source: ``reasoning-machines/gsm-hard`` (split ``train``, the only one; no full revision sha was
published) = reasoning-machines/pal @ f81ca2a ``datasets/gsmhardv2.jsonl`` (mirror
``gsm_hard/gsmhardv2.jsonl``). 1,319 items; targets are floats (303 non-integers, 146 negative,
e.g. row 0's -9867630.0 eggs: labels come from running the PAL program on the changed numbers).
The PAL ``code`` is kept in ``meta`` (it computes the answer, so it is never shown as input).

Scoring: every mode reads the number the final answer cue introduces (commas, currency, units,
negative signs and fractions handled by :func:`heldout.benchmarks.extraction.extract_number`).
The headline, ``published``, compares it with the target by PAL's rule (``abs(answer - target) <
1e-3``, ``scripts/gsm_eval.py``: how GSM-Hard's published numbers were scored), so "So the answer
is 72", "The answer is $72" and "The answer is 72.0." all score 1; strict and flexible use
:func:`heldout.benchmarks.extraction.numbers_match`; ``pal`` is PAL's comparison of the flexible
reading; ``pal_text`` is PAL's text rule (``scripts/gsm_zero_shot.py``: what follows the last
"The answer is ", capital T, as Python's ``float`` reads it), kept for numbers scored that way.
The seed prompt and the answer-format line ask for one form, "So the answer is <number>.",
which the headline reads (docs/scoring.md)."""

from __future__ import annotations

from typing import Any

from heldout.benchmarks import extraction
from heldout.contracts import DataError, Example, RunContext, Source, Verdict
from heldout.benchmarks.prompt_task import PromptBenchmark, modes_scored, prompt_verdict
from heldout.benchmarks.registry import register
from heldout.benchmarks.sources import iter_hub_rows, read_jsonl


class GSMHardTask(PromptBenchmark):
    name = "gsm_hard"
    family = "gsm_hard"
    metric = ("numeric match (published: PAL's |answer - target| < 1e-3 on the final cue's number; "
              "strict, flexible, pal, pal_text alongside)")
    version = "1"
    description = "GSM-Hard: grade-school math with large numbers; float targets"
    source = Source(hub_id="reasoning-machines/gsm-hard", config="default", split="train",
                    revision=None, mirror_files=("gsm_hard/gsmhardv2.jsonl",))
    # the seed instruction's form, with the answer named: the headline reads the final cue's number
    answer_format = "Finish with: So the answer is <number>."

    def read_mirror(self, data_dir: str) -> list[dict[str, Any]]:
        return read_jsonl(data_dir, "gsm_hard/gsmhardv2.jsonl")

    def read_hub(self) -> list[dict[str, Any]]:
        return [dict(row) for row in iter_hub_rows(self.source)]

    def to_examples(self, rows: list[dict[str, Any]]) -> list[Example]:
        out = []
        for index, row in enumerate(rows):
            try:
                out.append(Example(id=str(index), input={"question": row["input"]},
                                   target=float(row["target"]), meta={"code": row.get("code", "")}))
            except (KeyError, TypeError, ValueError) as exc:
                raise DataError(f"gsm_hard: malformed row {index}: {exc}") from exc
        return out

    def format_input(self, example: Example) -> str:
        return example.input["question"]

    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        return prompt_verdict(example.id, text, lambda clean: modes_scored(
            extraction.score_number(clean, example.target), example.target))


register(GSMHardTask())
