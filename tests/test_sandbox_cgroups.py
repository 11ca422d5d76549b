"""Whole-run cgroups: a harness never removes another live harness's group (a fresh group is
empty until its first process moves in), and it does remove groups a killed harness left."""

from __future__ import annotations

import subprocess
import sys

import pytest

from heldout.sandbox import cgroups
from heldout.sandbox.cgroups import GROUP_PREFIX, RunGroup, limits_level

pytestmark = pytest.mark.skipif(limits_level() == "rlimit",
                                reason="no writable cgroup hierarchy on this machine: only per-process limits apply")


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_fresh_empty_group_of_a_live_harness_survives_another_harness_starting():
    group = RunGroup.create(memory_mb=64, max_processes=4)
    try:
        assert group.dirs and all(d.is_dir() for d in group.dirs.values())
        cgroups._sweep_stale(cgroups._bases()[1])  # what a second harness does when it starts
        assert all(d.is_dir() for d in group.dirs.values())
    finally:
        group.close()
    assert not any(d.exists() for d in group.dirs.values())


def test_an_empty_group_left_by_a_killed_harness_is_swept():
    bases = cgroups._bases()[1]
    left = [base / f"{GROUP_PREFIX}{dead_pid()}-deadbeef0000" for base in bases.values()]
    for d in left:
        d.mkdir()
    cgroups._sweep_stale(bases)
    assert not any(d.exists() for d in left)


def test_a_group_tells_a_process_that_ran_in_it_and_exited_from_one_that_never_joined():
    never = RunGroup.create(memory_mb=64, max_processes=4)
    ran = RunGroup.create(memory_mb=64, max_processes=4)
    try:
        assert not never.was_joined()
        subprocess.run(ran.attach_argv([sys.executable, "-c", "x = bytearray(1 << 20)"]), check=True)
        assert not ran.has_members()  # the process is gone ...
        assert ran.was_joined()  # ... but it was in the group: its CPU time and memory stay charged
        assert not never.was_joined()
    finally:
        never.close()
        ran.close()
