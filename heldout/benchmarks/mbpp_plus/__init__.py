"""MBPP+ (EvalPlus): ``mbpp_plus``, 378 Python function-writing tasks, v0.2.0.

Source: evalplus's ``MbppPlus-v0.2.0.jsonl`` release (mirror ``mbpp_plus/MbppPlus-v0.2.0.jsonl``;
parsed with ``json``, since some test inputs are integers beyond 64 bits that Arrow refuses). The
hub copy ``evalplus/mbppplus`` has a different schema (tests baked into one string), so heldout
reads the release file only.

input = what a model sees (the docstring prompt and the function name); target = what scores it
(canonical solution, base and plus test inputs, ``atol``, contract, original asserts). Scoring
executes the extracted solution in the sandbox with evalplus semantics: base and plus tests
reported separately (``base`` is the weak verifier, ``plus`` the strong one); the score is
``plus`` (pass@1 on base + plus tests)."""

from __future__ import annotations

import re
from typing import Any

from heldout.contracts import DataError, Example, RunContext, RunLimits, Source, Verdict
from heldout.benchmarks.prompt_task import PromptBenchmark
from heldout.benchmarks.registry import register
from heldout.benchmarks.sources import read_jsonl
from heldout.benchmarks.mbpp_plus.execution import check_solution

MIRROR_FILE = "mbpp_plus/MbppPlus-v0.2.0.jsonl"
TARGET_FIELDS = ("canonical_solution", "base_input", "plus_input", "atol", "contract", "assertion")

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str, entry_point: str) -> str:
    """The solution inside a model answer: the last fenced block that defines ``entry_point``
    (else the last fenced block), or the whole text when there is no fence."""
    blocks = _FENCE.findall(text or "")
    if not blocks:
        return text or ""
    defining = [b for b in blocks if re.search(rf"def\s+{re.escape(entry_point)}\s*\(", b)]
    return (defining or blocks)[-1]


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

    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        context = context or self.context()
        which = ("base",) if context.option("tests") == "base" else ("base", "plus")
        code = extract_code(text, example.input["entry_point"])
        try:
            result = check_solution(problem_record(example), code, which=which, limits=context.limits)
        except Exception as exc:  # never raise for one bad solution
            return Verdict.failure(example.id, f"execution failed: {exc}", "crash")
        return result.to_verdict(example.id) if hasattr(result, "to_verdict") else result


register(MBPPPlusTask())
