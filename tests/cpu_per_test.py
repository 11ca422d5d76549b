"""A pytest plugin that measures each test's CPU seconds, for ranking the suite's work on a machine
whose wall times mean little (shared, loaded): this process's CPU (``time.process_time``), that of every
child it waited for (``RUSAGE_CHILDREN``: sandboxes, servers, CLI subprocesses) and that of its live
descendants (from ``/proc``: a fork server or a model server that outlives the test does its work
there), around each test's setup, call and teardown. A module- or session-scoped fixture counts in
the setup of the first test that asked for it; the work a thread it leaves running does later
counts in the tests that run meanwhile. A process whose parent exits before reaping it is missed.

    PYTHONPATH=tests .venv/bin/python -m pytest -p cpu_per_test tests/test_x.py -q
    HELDOUT_CPU_LOG=cpu.jsonl ...   # also append one JSON line per test: nodeid, setup, call, teardown

The summary prints the 20 tests with the most CPU and the total.
"""

from __future__ import annotations

import json
import os
import resource
import time

import pytest

_SECONDS: dict[str, dict[str, float]] = {}


_TICK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The children of ``pid``, from each of its threads' ``children`` list in /proc."""
    found = []
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task.name}/children") as f:
                found += [int(child) for child in f.read().split()]
    except OSError:
        pass  # gone meanwhile
    return found


def _live_descendants_cpu() -> float:
    """CPU seconds of this process's live descendants, each with the children it reaped. Walked
    from this process down its children lists rather than by reading every process of the machine
    (that scan, three times a test, cost more than most tests: 4.5 -> 32.5 CPU-s for
    test_architecture's 816 tests on a machine running 260 processes)."""
    total, pending = 0, _children(os.getpid())
    while pending:
        pid = pending.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime (fields after the name)
        pending += _children(pid)
    return total / _TICK


def _cpu_now() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime + _live_descendants_cpu()


def _measure(item, phase: str):
    start = _cpu_now()
    yield
    _SECONDS.setdefault(item.nodeid, {})[phase] = _cpu_now() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _measure(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _measure(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield from _measure(item, "teardown")


def pytest_terminal_summary(terminalreporter):
    if not _SECONDS:
        return
    totals = {nodeid: sum(phases.values()) for nodeid, phases in _SECONDS.items()}
    log = os.environ.get("HELDOUT_CPU_LOG")
    if log:
        with open(log, "a") as f:
            for nodeid, phases in _SECONDS.items():
                f.write(json.dumps({"nodeid": nodeid, **{k: round(v, 3) for k, v in phases.items()}}) + "\n")
    terminalreporter.write_sep("=", f"CPU seconds per test (with children): {sum(totals.values()):.1f} s in all")
    for nodeid, seconds in sorted(totals.items(), key=lambda kv: -kv[1])[:20]:
        phases = _SECONDS[nodeid]
        terminalreporter.write_line(f"{seconds:8.2f} s  (setup {phases.get('setup', 0):.2f}, "
                                    f"call {phases.get('call', 0):.2f})  {nodeid}")
