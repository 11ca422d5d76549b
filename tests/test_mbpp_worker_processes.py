"""check_many's worker processes (heldout/benchmarks/mbpp_plus/_schedule.py): each worker thread's
sandboxed runs go to a process of its own, kept to one core; a process that fails is the
harness's failure (an error), never a candidate's score, and none outlives its check_many."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from heldout.benchmarks.mbpp_plus import execution as mbpp_execution
from heldout.benchmarks.mbpp_plus._schedule import WorkerProcesses, WorkerProcessFailed
from heldout.contracts import DataError, RunLimits

LIMITS = RunLimits(wall_seconds=60, cpu_seconds=60, memory_mb=4096)


def where_am_i() -> tuple[int, list[int]]:
    return os.getpid(), sorted(os.sched_getaffinity(0))


def test_each_worker_process_is_its_own_process_kept_to_one_core():
    cores = sorted(os.sched_getaffinity(0))
    with WorkerProcesses(2) as processes:
        seen = [processes.of(k).call(__name__, "where_am_i", ()) for k in (0, 1)]
        pids = [w.pid for w in processes.workers]
    assert [pid for pid, _ in seen] == pids and os.getpid() not in pids and len(set(pids)) == 2
    assert [core for _, core in seen] == [[cores[0]], [cores[1 % len(cores)]]]
    for pid in pids:  # reaped at close
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_worker_process_that_dies_fails_the_call_as_the_harness_s_error():
    with WorkerProcesses(1) as processes:
        with pytest.raises(WorkerProcessFailed, match="worker process failed"):
            processes.of(0).call("os", "_exit", (3,))


def test_a_data_error_in_a_worker_process_is_raised_as_one_and_others_as_the_harness_s():
    with WorkerProcesses(1) as processes:
        worker = processes.of(0)
        with pytest.raises(DataError, match="Mbpp/0"):
            worker.call("heldout.benchmarks.mbpp_plus.execution", "_truth_batch",
                        ([({"task_id": "Mbpp/0", "prompt": "", "canonical_solution": "def f(x):\n    raise ValueError\n",
                            "entry_point": "f"}, [[1]])], LIMITS, 1.0))
        with pytest.raises(WorkerProcessFailed, match="ZeroDivisionError"):
            worker.call("operator", "truediv", (1, 0))
        assert worker.call("operator", "add", (1, 2)) == 3  # the worker goes on after an error


def test_check_many_runs_its_sandboxed_calls_in_worker_processes_and_in_process_with_one_worker(monkeypatch):
    problem = {"task_id": "Mbpp/9000", "prompt": "", "entry_point": "add", "canonical_solution":
               "def add(a, b):\n    return a + b\n", "base_input": [[1, 2], [3, 4]], "plus_input": [[5, 6]], "atol": 0}
    wrong = "def add(a, b):\n    return a - b\n"
    calls_here = []
    check = mbpp_execution._check_against
    monkeypatch.setattr(mbpp_execution, "_check_against", lambda *a: calls_here.append(1) or check(*a))
    monkeypatch.setattr(mbpp_execution, "_truth_cache", {})
    items = [(problem, problem["canonical_solution"]), (problem, wrong)]
    two = mbpp_execution.check_many(items, workers=2, limits=LIMITS)
    assert [r.plus_pass for r in two] == [True, False] and calls_here == []  # the checks ran in the workers
    monkeypatch.setattr(mbpp_execution, "_truth_cache", {})
    one = mbpp_execution.check_many(items, workers=1, limits=LIMITS)
    assert [r.plus_pass for r in one] == [True, False] and len(calls_here) == 2
    assert [r.first_failure() for r in one] == [r.first_failure() for r in two]


def test_a_killed_harness_leaves_no_worker_process_behind_even_one_in_the_middle_of_a_call():
    harness = subprocess.Popen([sys.executable, "-c", (
        "import threading, time\n"
        "from heldout.benchmarks.mbpp_plus._schedule import WorkerProcesses\n"
        "processes = WorkerProcesses(2)\n"
        "threading.Thread(target=processes.of(0).call, args=('time', 'sleep', (60,)), daemon=True).start()\n"
        "print(*[w.pid for w in processes.workers], flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in harness.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    finally:
        harness.kill()
        harness.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def test_check_many_runs_in_process_when_no_worker_process_can_be_forked(monkeypatch):
    problem = {"task_id": "Mbpp/9001", "prompt": "", "entry_point": "double", "canonical_solution":
               "def double(a):\n    return 2 * a\n", "base_input": [[1], [2]], "plus_input": [[3]], "atol": 0}

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.setattr(mbpp_execution, "_truth_cache", {})
    results = mbpp_execution.check_many([(problem, problem["canonical_solution"])] * 2, workers=2, limits=LIMITS)
    assert [r.plus_pass for r in results] == [True, True]
