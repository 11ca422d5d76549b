"""Scoring outputs generated elsewhere (the evalplus habit): a JSONL of ``{"id", "output"}`` rows
scored with a prompt task's canonical verifier, exactly as a session's worker output would be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from heldout.benchmarks.loading import Task
from heldout.contracts import DataError, HeldoutError, Verdict
from heldout.files import read_user_text

MAX_ROWS = 1_000_000


def read_outputs(path: str | Path) -> dict[str, str]:
    """``id -> output`` from a JSONL file; a malformed or repeated row is a clear error naming its line."""
    outputs: dict[str, str] = {}
    text = read_user_text(path, "outputs file")  # a directory, bad UTF-8 ...: one clear error, not a traceback
    for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ex_id, output = row["id"], row["output"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{path} line {lineno}: need a JSON object with id and output: {exc}") from None
        if not isinstance(output, str):
            raise DataError(f"{path} line {lineno}: output must be a string, got {type(output).__name__}")
        if str(ex_id) in outputs:
            raise DataError(f"{path} line {lineno}: id {ex_id!r} appears twice")
        outputs[str(ex_id)] = output
        if len(outputs) > MAX_ROWS:
            raise DataError(f"{path}: more than {MAX_ROWS} rows")
    if not outputs:
        raise DataError(f"outputs file {path} holds no rows (want one {{\"id\": ..., \"output\": ...}} per line)")
    return outputs


def score_outputs(task: Task, outputs: dict[str, str], split: str) -> tuple[list[Verdict], dict[str, Any]]:
    """Score every example of ``split`` that has an output; ids outside the split are an error, and
    examples without an output are counted in the summary (``missing``), never silently dropped."""
    bench = task.benchmark
    if bench.kind != "prompt":
        raise HeldoutError(f"{task.name} is a program task: score candidates with `heldout eval`")
    examples = {ex.id: ex for ex in task.split(split)}
    unknown = [i for i in outputs if i not in examples]
    if unknown:
        raise DataError(f"{len(unknown)} output id(s) are not in split {split!r} of {task.name} "
                        f"(profile {task.profile}): {unknown[:5]}")
    context = bench.context()
    scored = [ex for ex_id, ex in examples.items() if ex_id in outputs]
    verdicts = [bench.score_text(outputs[ex.id], ex, context) for ex in scored]
    summary = bench.summarize({"instruction": "(outputs scored offline)"}, verdicts, context)
    summary.update({"profile": task.profile, "split": split, "missing": len(examples) - len(scored),
                    "dimensions": _mean_dimensions(verdicts)})
    return verdicts, summary


def _mean_dimensions(verdicts: list[Verdict]) -> dict[str, float]:
    keys = sorted({k for v in verdicts for k in v.dimensions})
    return {k: sum(v.dimensions.get(k, 0.0) for v in verdicts) / len(verdicts) for k in keys} if verdicts else {}
