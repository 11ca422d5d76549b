"""Containment channels between executions of one fork server (issue 34).

The adversary is a candidate that wants to leave something for a later execution (another
candidate, possibly scored on train inputs whose outputs the optimizer sees) or to make that later
execution fail. Every writable place an execution can reach must be fresh for the next one."""

from __future__ import annotations

import random

import pytest

from heldout.contracts import RunLimits
from heldout.sandbox import PROGRAM_PRELOAD, root, run_calls, run_function, zygote

pytestmark = pytest.mark.skipif(not zygote.fork_server_enabled(),
                                reason="the fork server needs a root harness with cgroup v1 limits")

LIMITS = RunLimits(wall_seconds=20, cpu_seconds=20, memory_mb=512, max_processes=32)

PARK_IN_SHM = '''\
import os
def f(token):
    with open("/dev/shm/heldout-parked", "w") as out:
        out.write(token)
    return sorted(os.listdir("/dev/shm"))
'''

FILL_SHM = '''\
def f():
    block = b"x" * (1 << 20)
    written = 0
    try:
        for n in range(1024):  # several files: one file is capped by the file-size rlimit
            with open(f"/dev/shm/filler{n}", "wb") as out:
                for _ in range(8):
                    out.write(block)
                    out.flush()
                    written += len(block)
    except OSError as exc:
        return ["full", exc.errno, written]
    return ["not full", 0, written]
'''

LOOK_IN_SHM = '''\
import os
def f():
    names = sorted(os.listdir("/dev/shm"))
    parked = [open("/dev/shm/" + n).read() for n in names if n == "heldout-parked"]
    with open("/dev/shm/mine", "wb") as out:  # a small write must succeed: /dev/shm is not full
        out.write(b"y" * 4096)
    return [names, parked]
'''


def run(source: str, *args):
    return run_function({"prog.py": source}, "prog", "f", list(args), limits=LIMITS, preload=PROGRAM_PRELOAD)


def test_a_file_parked_in_dev_shm_is_gone_for_the_next_execution():
    rng = random.Random(34)
    for _ in range(5):
        token = f"test-input-{rng.getrandbits(64):016x}"
        park = run(PARK_IN_SHM, token)
        assert park.ok and park.forked and park.value == ["heldout-parked"], park.error
        look = run(LOOK_IN_SHM)
        assert look.ok and look.forked, look.error
        assert look.value == [[], []], f"the earlier execution's /dev/shm was visible: {look.value}"


def test_one_execution_filling_dev_shm_leaves_the_next_one_working():
    fill = run(FILL_SHM)
    assert fill.ok and fill.forked, fill.error
    assert fill.value[0] == "full" and fill.value[1] == 28, fill.value  # ENOSPC: /dev/shm is capped
    look = run(LOOK_IN_SHM)
    assert look.ok and look.forked, f"the next execution failed after /dev/shm was filled: {look.error}"
    assert look.value == [[], []]


def test_the_fork_servers_dev_shm_has_a_fresh_sandboxs_cap():
    source = (zygote._HERE / "_zygote.py").read_text(encoding="utf-8")
    assert f'SHM, SHM_BYTES = "/dev/shm", {root.SHM_MB} << 20' in source


READ_SIBLINGS = '''\
import os
def f():
    """What this execution can read of any process but itself (the reaper, the memory holder)."""
    readable = []
    me = os.getpid()
    for pid in [1, 2, 3, 4] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        if pid == me:
            continue
        for what in ("maps", "cmdline", "stat", "status", "environ", "smaps", "syscall", "wchan"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as fh:
                    if fh.read(64):
                        readable.append(f"{pid}/{what}")
            except OSError:
                pass
    return [me, sorted(set(readable))]
'''


def test_nothing_of_the_reaper_or_the_memory_holder_is_readable():
    """The holder shares the child's memory, so the kernel's same-memory rule let the child read
    its maps; the reaper's cmdline and status were world-readable. Repeated, for timing variation
    (the holder is made while the child sets up)."""
    for _ in range(20):
        r = run(READ_SIBLINGS)
        assert r.ok and r.forked, r.error
        me, readable = r.value
        assert me == 2 and readable == [], readable


# -- family 3: test inputs do not exist in the candidate's process before their call -------------------
LOOK_FOR_INPUTS = '''
import gc, sys

MARK = "heldout-input-marker-"


def visible_inputs():
    found = set()
    for obj in gc.get_objects():  # every container the process holds: frames' locals, the job ...
        try:
            if type(obj) in (list, tuple):  # exact types: a lazy tuple subclass may run code on iteration
                found.update(x for x in obj if isinstance(x, str) and x.startswith(MARK))
            elif type(obj) is dict:
                found.update(x for x in obj.values() if isinstance(x, str) and x.startswith(MARK))
        except Exception:
            pass
    frame = sys._getframe()
    while frame is not None:  # and every frame up the stack, as the MBPP+ attack walked them
        for value in frame.f_locals.values():
            if isinstance(value, (str, bytes)) and MARK in str(value):
                found.add(str(value))
        frame = frame.f_back
    return sorted(found - {MARK})  # (the probe's own constant)


AT_IMPORT = visible_inputs()


def f(marker):
    return {"at_import": AT_IMPORT, "at_call": visible_inputs()}
'''


def test_no_test_input_is_in_the_candidates_process_before_its_call():
    markers = [f"heldout-input-marker-{k}" for k in range(4)]
    for fork_server in (True, False):
        result = run_calls({"probe.py": LOOK_FOR_INPUTS}, "probe", "f", [([m], {}) for m in markers],
                           limits=LIMITS, fork_server=fork_server)
        assert result.ok, result.error
        for k, value in enumerate(result.value):
            assert value["at_import"] == []  # the import saw no input at all
            assert markers[k] in value["at_call"]  # control: the probe finds the input it was given
            assert not set(markers[k + 1:]) & set(value["at_call"])  # and never a later one
