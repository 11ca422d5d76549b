"""The MBPP+ expected outputs the suite keeps between runs (tests/mbpp_truths.py): a module's
truths come back in the next run without a sandboxed run, only to the module that asks, only for
the same data and code, and never from a file someone else could have written."""

from __future__ import annotations

import json
import tempfile

import pytest

from heldout.benchmarks.mbpp_plus import execution
from heldout.contracts import RunLimits
import mbpp_truths
from mbpp_truths import cache_file, kept_truths

LIMITS = RunLimits(wall_seconds=60, cpu_seconds=60, memory_mb=1024)


@pytest.fixture
def one_problem(data_dir, tmp_path, monkeypatch):
    """A data file of one real problem, and a temp dir of the test's own for the kept file."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    problems = execution.load_problems(data_dir / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl")
    problem = next(p for p in problems if p["task_id"] == "Mbpp/2")
    data_file = tmp_path / "one.jsonl"
    data_file.write_text(json.dumps(problem) + "\n")
    return data_file, execution.load_problems(data_file)[0]


def no_sandboxed_run(monkeypatch):
    def refuse(*_):
        raise AssertionError("an expected output was computed again")
    monkeypatch.setattr(execution, "_truth_shard", refuse)


def test_a_modules_truths_come_back_in_the_next_run_without_running_the_canonical_solution(one_problem, monkeypatch):
    data_file, problem = one_problem
    before = execution._truth_cache
    key = execution._problem_key(problem)
    held_before = before.get(key)  # this process may already hold it (another test of this worker computed it)
    with kept_truths(data_file) as truths:
        computed = execution.ground_truth(problem, limits=LIMITS)
        assert list(truths) == [key]
    assert execution._truth_cache is before and before.get(key) == held_before  # others never see what it kept
    no_sandboxed_run(monkeypatch)
    with kept_truths(data_file):
        assert execution.ground_truth(problem, limits=LIMITS) == computed
        assert execution.check_solution(problem, problem["prompt"] + problem["canonical_solution"],
                                        limits=LIMITS).plus_pass  # the check alone ran


def test_another_data_file_or_a_file_others_could_write_starts_afresh(one_problem, monkeypatch):
    data_file, problem = one_problem
    with kept_truths(data_file):
        execution.ground_truth(problem, limits=LIMITS)
    kept = cache_file(data_file)
    assert kept.exists() and mbpp_truths.load(kept)
    data_file.write_text(data_file.read_text() + "\n")  # the same problems, other bytes
    assert cache_file(data_file) != kept
    data_file.write_text(data_file.read_text().rstrip("\n") + "\n")
    assert cache_file(data_file) == kept
    kept.parent.chmod(0o777)  # a directory anyone may write: the file in it may be anyone's pickle
    assert mbpp_truths.load(kept) == {}
    kept.parent.chmod(0o700)
    kept.chmod(0o666)
    assert mbpp_truths.load(kept) == {}
    kept.chmod(0o600)
    kept.write_bytes(b"not a pickle")
    assert mbpp_truths.load(kept) == {}
