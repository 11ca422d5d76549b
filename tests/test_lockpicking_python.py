"""Python candidates of lockpicking/six (``score(program: str) -> int``) run in the sandbox, one
process per batch; crashes, wrong types and hangs score 0 with a named error."""

from __future__ import annotations

import pytest

from heldout.benchmarks.lockpicking import task as lockpicking_task

from heldout import load_task
from heldout.contracts import Example, RunLimits
from heldout.benchmarks.lockpicking import task as taskmod
from heldout.benchmarks.lockpicking.rules import CANDIDATE_SETS, TRIGGER_RULES, TRUTH
from heldout.benchmarks.lockpicking.task import LockpickingBenchmark

RECOVERED = f"""
SETS = {[sorted(s) for s in CANDIDATE_SETS]!r}
RULES = {list(TRIGGER_RULES)!r}

def score(program):
    if len(program) != 6 or any(c not in "0123456789" for c in program):
        return 0
    digits = [int(c) for c in program]
    valid = [digits[i] in SETS[i] for i in range(6)]
    for trigger, digit, a, b in RULES:
        if digits[trigger - 1] == digit:
            valid[a - 1] = valid[b - 1] = False
    return sum(valid)
"""

# Forgets rule 12 (P6 = 9 -> P4, P5) and crashes on malformed strings (int() of a letter).
PARTIAL = RECOVERED.replace("(6, 9, 4, 5)", "(6, 0, 4, 5)").replace(
    'if len(program) != 6 or any(c not in "0123456789" for c in program):\n        return 0',
    "if len(program) != 6:\n        return 0")


@pytest.fixture(scope="module")
def paper():
    return load_task("lockpicking/six", profile="paper")


@pytest.fixture()
def counted_sandbox(monkeypatch):
    """Counts sandbox processes started by the task (the real sandbox runs every one of them)."""
    calls: list[str] = []
    real = lockpicking_task.run_function

    def counting(files, module, function, *args, **kwargs):
        calls.append(function)
        return real(files, module, function, *args, **kwargs)

    monkeypatch.setattr(lockpicking_task, "run_function", counting)
    return calls


def test_a_recovered_python_scorer_is_exact_on_the_fifty_and_exhaustively(paper, counted_sandbox):
    bench, candidate = LockpickingBenchmark(), {"program.py": RECOVERED}
    verdicts = [bench.run(candidate, ex) for ex in paper.split("test")]
    summary = bench.summarize(candidate, verdicts)
    assert summary["correct"] == 50 and summary["form"] == "python" and summary["error"] is None
    assert summary["exhaustive_accuracy"] == 1.0
    assert counted_sandbox == ["score_batch", "score_exhaustive"]  # one process per batch


def test_a_partial_scorer_is_scored_per_example_and_its_crashes_are_named(paper):
    bench, candidate = LockpickingBenchmark(), {"program.py": PARTIAL}
    verdicts = [bench.run(candidate, ex) for ex in paper.split("test")]
    crashed = [v for v in verdicts if v.error_kind == "bad_output"]
    assert crashed and all("ValueError" in v.error for v in crashed)
    assert {paper.split("test")[verdicts.index(v)].input["program"] for v in crashed} == {"72940a", "72 405"}
    summary = bench.summarize(candidate, verdicts)
    assert 0 < summary["correct"] < 50
    assert 0 < summary["exhaustive_accuracy"] < 1.0


def test_a_program_that_does_not_import_fails_every_example_with_the_traceback():
    verdict = LockpickingBenchmark().run({"program.py": "def score(program)\n    return 0\n"},
                                         Example("e", {"program": "729405"}, 6))
    assert verdict.score == 0 and verdict.error_kind == "crash" and "SyntaxError" in verdict.error


def test_a_missing_score_function_and_a_wrong_return_type_are_clear_errors():
    example = Example("e", {"program": "729405"}, 6)
    verdict = LockpickingBenchmark().run({"program.py": "def count(program):\n    return 6\n"}, example)
    assert verdict.score == 0 and "score(program: str) -> int" in verdict.error
    verdict = LockpickingBenchmark().run({"program.py": "def score(program):\n    return '6'\n"}, example)
    assert verdict.error_kind == "bad_output" and "not an int" in verdict.error
    verdict = LockpickingBenchmark().run({"program.py": "def score(program):\n    return True\n"}, example)
    assert verdict.error_kind == "bad_output"


def test_a_hanging_program_is_stopped_by_the_wall_clock_limit():
    limits = RunLimits(wall_seconds=2.0, cpu_seconds=5.0)
    verdict = LockpickingBenchmark().run({"program.py": "def score(program):\n    while True:\n        pass\n"},
                                         Example("e", {"program": "729405"}, 6), LockpickingBenchmark().context(limits))
    assert verdict.score == 0 and verdict.error_kind == "timeout"


def test_a_candidate_cannot_replace_the_trusted_runner():
    candidate = {"program.py": RECOVERED, f"{taskmod.RUNNER_MODULE}.py": "def score_batch(p):\n    return []\n"}
    verdict = LockpickingBenchmark().run(candidate, Example("e", {"program": "729405"}, 6))
    assert verdict.score == 0 and verdict.error_kind == "malformed_candidate" and "reserved" in verdict.error


def test_truth_labels_used_by_the_runner_match_the_engine():
    # the exhaustive comparison aligns the runner's row k with the string f"{k:06d}"
    assert taskmod._exhaustive_truth()[729405] == TRUTH.label("729405") == 6
