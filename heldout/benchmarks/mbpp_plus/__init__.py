"""MBPP+ (EvalPlus): ``mbpp_plus``, 378 Python function-writing tasks, v0.2.0.

Source: evalplus's ``MbppPlus-v0.2.0.jsonl`` release (mirror ``mbpp_plus/MbppPlus-v0.2.0.jsonl``;
parsed with ``json``, since some test inputs are integers beyond 64 bits that Arrow refuses). The
hub copy ``evalplus/mbppplus`` has a different schema (tests baked into one string), so heldout
reads the release file only.

input = what a model sees (the docstring prompt and the function name); target = what scores it
(canonical solution, base and plus test inputs, ``atol``, contract, original asserts). Scoring
executes the extracted solution in the sandbox with evalplus semantics: base and plus tests
reported separately (``base`` is the weak verifier, ``plus`` the strong one); the score is
``plus`` (pass@1 on base + plus tests).

Code extraction: :func:`heldout.benchmarks.extraction.code.extract_code` (evalplus's sanitizer
when installed, heldout's equivalent otherwise). Every verdict is built by
:func:`heldout.benchmarks.prompt_task.prompt_verdict`: an answer with no code defining the entry
point, or code that fails a test (wrong, crash, timeout), is a valid verdict scoring 0 whose
feedback names the first failure; only a failed model call or a harness failure is invalid."""

from __future__ import annotations

from typing import Any

from heldout.benchmarks.extraction.code import extract_code
from heldout.benchmarks.mbpp_plus.execution import MbppResult, check_solution
from heldout.benchmarks.prompt_task import PromptBenchmark, Scored, prompt_verdict
from heldout.benchmarks.registry import register
from heldout.benchmarks.sources import read_jsonl
from heldout.contracts import Candidate, DataError, Example, RunContext, RunLimits, Source, Verdict

MIRROR_FILE = "mbpp_plus/MbppPlus-v0.2.0.jsonl"
TARGET_FIELDS = ("canonical_solution", "base_input", "plus_input", "atol", "contract", "assertion")

SEED_INSTRUCTION = (
    "You are an expert Python programmer. Read the task and its example test carefully, then write a "
    "correct Python function that solves it for every valid input, not only the example. Reply with the "
    "complete function, including any imports and helpers it needs, in one ```python code block; do not "
    "call the function, read input or print in that block."
)
"""The MBPP+ seed prompt: code in one block (the generic seed asks for 'So the answer is ...')."""


def scored_solution(result: MbppResult, code: str, headline: str = "plus") -> Scored:
    """A :class:`Scored` from an execution result: ``base`` and ``plus`` pass@1 as dimensions,
    the suites' counts and the first failure as feedback."""
    dims = {"base": float(result.base_pass), "plus": float(result.plus_pass)}
    lines = [f"base: {result.base.status} ({result.base.passed}/{result.base.total})"]
    if result.plus is not None:
        lines.append(f"plus: {result.plus.status} ({result.plus.passed}/{result.plus.total})")
    fail = result.first_failure()
    if fail:
        lines.append(f"first failure ({fail['suite']} test {fail['index']}): {fail['reason']}: {fail['message']}")
    return Scored(dimensions=dims, headline=headline, answer=code,
                  shown=f"solution of {len(code.splitlines())} lines", detail="\n".join(lines),
                  output={"code": code, "base": result.base_pass, "plus": result.plus_pass, "failure": fail,
                          "failure_reason": fail["reason"] if fail else None, "seconds": result.seconds})


def problem_record(example: Example) -> dict[str, Any]:
    """The evalplus record an example was built from."""
    return {"task_id": example.id, **example.input, **example.target}


class MBPPPlusTask(PromptBenchmark):
    name = "mbpp_plus"
    family = "mbpp_plus"
    metric = "pass@1 (base+plus; base alongside)"
    version = "0.2.0"
    description = "MBPP+ v0.2.0: write a Python function; executed against base and plus tests"
    source = Source(hub_id=None, mirror_files=(MIRROR_FILE,))
    default_limits = RunLimits(wall_seconds=60.0, cpu_seconds=60.0, memory_mb=2048)
    answer_format = ("Write the complete Python function (with any imports it needs) in one "
                     "```python code block.")

    def read_mirror(self, data_dir: str) -> list[dict[str, Any]]:
        return read_jsonl(data_dir, MIRROR_FILE)

    def read_hub(self) -> list[dict[str, Any]]:
        raise DataError("mbpp_plus loads from the evalplus release file only: pass --data-dir (or set "
                        "HELDOUT_DATA_DIR) to a directory holding mbpp_plus/MbppPlus-v0.2.0.jsonl")

    def to_examples(self, rows: list[dict[str, Any]]) -> list[Example]:
        out = []
        for row in rows:
            try:
                out.append(Example(
                    id=row["task_id"],
                    input={"prompt": row["prompt"], "entry_point": row["entry_point"]},
                    target={k: row[k] for k in TARGET_FIELDS},
                    meta={},
                ))
            except KeyError as exc:
                raise DataError(f"mbpp_plus: record {row.get('task_id')!r} lacks field {exc}") from exc
        return out

    def format_input(self, example: Example) -> str:
        return (f"{example.input['prompt'].strip()}\n\nName the function "
                f"`{example.input['entry_point']}`.")

    # the weak test set a verifier variant may optimise against (held-out: always base + plus)
    verifier_options = {"base-only": {"tests": "base"}}

    def seed_candidate(self) -> Candidate:
        return {"instruction": SEED_INSTRUCTION}

    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        context = context or self.context()
        which = ("base",) if context.option("tests") == "base" else ("base", "plus")
        headline = "base" if which == ("base",) else "plus"

        def score(clean: str) -> Scored:
            code = extract_code(clean, example.input["entry_point"])
            if code is None:
                return Scored(dimensions={"base": 0.0, "plus": 0.0}, headline=headline, answer=None, why="no_code",
                              detail=f"write a function named `{example.input['entry_point']}` in a ```python block")
            result = check_solution(problem_record(example), code, which=which, limits=context.limits)
            return scored_solution(result, code, headline)

        return prompt_verdict(example.id, text, score)


register(MBPPPlusTask())
