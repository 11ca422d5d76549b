"""A prompt task built from a user's own JSONL file (``heldout data freeze --jsonl FILE --task NAME
--answer-format FORMAT``).

Each line is ``{"id", "input", "target"[, "group", "meta"]}``; ``input`` is a string (the question)
or an object with a ``question`` field (other fields are shown as ``key: value`` lines above it).
Freezing copies the file next to the manifest (``<manifest root>/<task>.jsonl``) and records the
answer format in the manifest's source, so the task loads anywhere the manifest is on the search
path, verified against its hashes like every shipped task. The answer formats reuse the shipped
scorers: ``number`` (GSM-Hard's rule), ``span`` (HotpotQA's exact match / F1), and ``judge``: a model
judge with :data:`~heldout.benchmarks.judge.DEFAULT_RUBRIC` against the target as reference answer
(:mod:`heldout.benchmarks.judge`). Each format offers the other scoring as a verifier variant for
optimisation: ``number``/``span`` tasks ``tests:judge`` (optimise against the judge, held-out by the
rule), ``judge`` tasks ``tests:exact`` (the span rule)."""

from __future__ import annotations

import json
from pathlib import Path

from heldout.benchmarks import extraction
from heldout.benchmarks.judge import DEFAULT_RUBRIC, SCORER_OPTION, ModelJudge
from heldout.benchmarks.prompt_task import PromptBenchmark, modes_scored, prompt_verdict
from heldout.contracts import DataError, Example, RunContext, Source, Verdict
from heldout.files import read_user_text

MAX_USER_JSONL_BYTES = 1 << 30

ANSWER_FORMATS = ("number", "span", "judge")
_FORMAT_LINE = {"number": "Finish with: So the answer is <number>.",
                "span": "Finish with: So the answer is <answer>.",
                "judge": "Answer the question; finish with: So the answer is <answer>."}


def read_user_examples(path: str | Path) -> list[Example]:
    """The examples of a user JSONL file; a clear error names the line of a malformed row."""
    out = []
    text = read_user_text(path, "examples file", max_bytes=MAX_USER_JSONL_BYTES)
    for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(Example(id=str(row["id"]), input=row["input"] if isinstance(row["input"], dict)
                               else {"question": str(row["input"])}, target=row.get("target"),
                               group=row.get("group"), meta=row.get("meta") or {}))
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{path} line {lineno}: need a JSON object with id, input, target: {exc}") from None
    if not out:
        raise DataError(f"{path} holds no examples")
    return out


class UserJsonlTask(PromptBenchmark):
    """One user task; ``data_file`` is the frozen copy of the JSONL next to its manifest."""

    family = "user"
    version = "user"
    source = Source(embedded=True)

    def __init__(self, name: str, data_file: Path, answer_format: str) -> None:
        if answer_format not in ANSWER_FORMATS:
            raise DataError(f"task {name!r}: answer format {answer_format!r} is not one of {', '.join(ANSWER_FORMATS)}")
        self.name = name
        self.data_file = Path(data_file)
        self.answer_format = _FORMAT_LINE[answer_format]
        self.format = answer_format
        self.metric = {"number": "accuracy", "span": "exact match",
                       "judge": f"model judge ({DEFAULT_RUBRIC.name})"}[answer_format]
        self.judge = ModelJudge(DEFAULT_RUBRIC)
        self.verifier_options = ({"exact": {SCORER_OPTION: "span"}} if answer_format == "judge"
                                 else {"judge": {SCORER_OPTION: "judge"}})
        self.description = f"user task from {self.data_file.name} ({answer_format} answers)"

    def load_raw(self, data_dir: str | None = None) -> list[Example]:
        if not self.data_file.is_file():
            raise DataError(f"task {self.name!r}: its data file {self.data_file} is missing")
        return read_user_examples(self.data_file)

    def format_input(self, example: Example) -> str:
        lines = [f"{k}: {v}" for k, v in example.input.items() if k != "question"]
        return "\n".join(lines + [str(example.input.get("question", ""))])

    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        context = context or self.context()
        scorer = context.option(SCORER_OPTION, self.format)
        if scorer == "judge":
            return self.judge.score(example, self.format_input(example), text if isinstance(text, str) else "",
                                    context, None if example.target is None else str(example.target))
        if scorer == "number":
            return prompt_verdict(example.id, text, lambda clean: modes_scored(
                extraction.score_number(clean, float(example.target)), example.target))
        return prompt_verdict(example.id, text, lambda clean: modes_scored(
            extraction.score_span(clean, str(example.target)), example.target))
