"""Whole-run cgroups: a harness never removes another live harness's group (a fresh group is
empty until its first process moves in), and it does remove groups a killed harness left."""

from __future__ import annotations

import subprocess
import time
import sys

import pytest

from heldout.sandbox import cgroups
from heldout.sandbox.cgroups import GROUP_PREFIX, RunGroup, limits_level
from heldout.sandbox.monitor import RunMeter

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


def test_the_monitor_tells_a_process_that_ran_in_a_group_and_exited_from_one_that_never_joined():
    """RunMeter.joined reads the group's live counters where GroupFiles says they are: a member
    now, or CPU time and memory charged to the group (what a fast forked run leaves)."""
    never = RunGroup.create(memory_mb=64, max_processes=4)
    ran = RunGroup.create(memory_mb=64, max_processes=4)
    try:
        assert not RunMeter(never.files, None).joined()
        subprocess.run(ran.attach_argv([sys.executable, "-c", "x = bytearray(1 << 20)"]), check=True)
        assert not any(open(procs).read().split() for procs in ran.files.procs)  # the process is gone ...
        assert RunMeter(ran.files, None).joined()  # ... but it was in the group: its charges stay
        assert not RunMeter(never.files, None).joined()
        assert not RunMeter(RunGroup("rlimit").files, None).joined()  # no group: nothing to be in
    finally:
        never.close()
        ran.close()


def test_the_monitors_clock_reads_the_groups_cpu_counter_as_the_group_does():
    """One pread of the counter through a kept descriptor (RunMeter.cpu) against the group's own
    reading: the same CPU seconds, and after a busy child more than it burned."""
    group = RunGroup.create(memory_mb=256, max_processes=4)
    if group.files.cpu is None:
        group.close()
        pytest.skip("no CPU controller: the clock is /proc's")
    meter = RunMeter(group.files, None)
    try:
        assert meter.cpu() == group.cpu_seconds() == 0
        burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
        subprocess.run(group.attach_argv([sys.executable, "-c", burn]), check=True)
        assert meter.cpu() == group.cpu_seconds() >= 0.3
        counts = group.ended(kill=True, finished=False)
        assert counts.cpu_seconds == meter.cpu() and not counts.memory_hit and not counts.processes_hit
        assert counts.peak_memory_mb and counts.peak_memory_mb > 1
    finally:
        meter.close()
        group.close()


def test_the_groups_of_a_fork_server_whose_harness_was_killed_are_swept_with_its_executions_groups():
    """A harness killed with SIGKILL mid-study cannot remove its groups. Under cgroup v1 a fork
    server's group holds one group per execution, and a group with groups inside cannot be
    removed: the next harness removes the inner ones first (else every kill left its groups for
    good: they had piled up by the thousand on one machine)."""
    harness = subprocess.Popen(
        [sys.executable, "-c", "from heldout.contracts import RunLimits\n"
         "from heldout.sandbox.process import run_function\n"
         "for x in range(3):\n"
         "    run_function({'m.py': 'def f(x): return x'}, 'm', 'f', [x], limits=RunLimits(wall_seconds=20))\n"
         "print('ran', flush=True)\nimport time; time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert harness.stdout.readline().strip() == "ran"
        left = [d for base in cgroups._bases()[1].values() for d in base.glob(f"{GROUP_PREFIX}{harness.pid}-*")]
        assert left, "the harness made no group of its own"
    finally:
        harness.kill()
        harness.wait()
    # its zygote and executions are gone once it is (their groups then hold no process)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(open(d / "cgroup.procs").read().split()
                                              for top in left for d in (top, *cgroups._nested(top))):
        time.sleep(0.05)
    cgroups._sweep_stale(cgroups._bases()[1])  # what the next harness does when it starts
    assert not [d for d in left if d.exists()]
