"""A wall clock (a call's backstop, a run's limit) stops a program that sleeps or waits, never one the
machine's other work kept from a CPU (DESIGN "Time"). A call's CPU limit does not depend on the
load; its wall backstop (4 x the limit + 2 s) did: with one core shared by 40 busy processes, a call
that needs a tenth of its CPU limit takes longer than its backstop and was scored a timeout, "the
program sleeps or waits". The clocks now leave out the time the run's threads waited, runnable, for
a CPU (the kernel's run delay): the starved call, and a starved run past its whole wall limit,
finish with their verdicts from an idle machine, and a call that really sleeps is stopped as before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from heldout.contracts import wall_backstop
from heldout.sandbox import isolation_mode

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
BURNERS = 40
PER_CALL = 0.25  # CPU seconds: its wall backstop is 3 s

# spinners on CPU 0 only, each in a session of its own: the scheduler shares a core between
# sessions first (autogroups), and the sandbox starts its program in a session of its own, so a
# process there gets about 1/41 of CPU 0. Each dies with the first (PR_SET_PDEATHSIG).
BURN = f"""
import ctypes, os, signal
os.sched_setaffinity(0, {{0}})
for _ in range({BURNERS}):
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        os.setsid()
        while True:
            pass
signal.pause()
"""

# the harness imports heldout on any core, then pins itself (and so the sandboxed process it
# starts) to CPU 0: a sleeping call first, then one that computes for 0.1 s of CPU
HARNESS = f"""
import json, os
from heldout.contracts import RunLimits
from heldout.sandbox.process import run_calls
code = {{"work.py": "import time\\n"
                    "def work(kind, seconds):\\n"
                    "    if kind == 'sleep':\\n"
                    "        time.sleep(seconds)\\n"
                    "    start = time.process_time()\\n"
                    "    while time.process_time() - start < seconds:\\n"
                    "        pass\\n"
                    "    return kind\\n"}}
os.sched_setaffinity(0, {{0}})
result = run_calls(code, "work", "work", [(("sleep", 60), {{}}), (("compute", 0.1), {{}})],
                   per_call_seconds=[{PER_CALL}, {PER_CALL}], limits=RunLimits(wall_seconds=120, cpu_seconds=10),
                   fork_server=False)
whole = run_calls(code, "work", "work", [(("compute", 0.1), {{}})], limits=RunLimits(wall_seconds=3, cpu_seconds=10),
                  fork_server=False)
print(json.dumps({{"calls": result.calls, "whole": [whole.ok, whole.error, whole.seconds]}}))
"""


@pytest.mark.skipif(isolation_mode() == "none", reason="no sandbox here: the run delay is read through its group")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or 0 not in os.sched_getaffinity(0),
                    reason="needs CPU 0 and another core: the harness imports on one while CPU 0 is starved")
def test_a_call_starved_of_cpu_by_other_work_is_not_a_timeout_and_a_sleeping_one_still_is():
    burners = subprocess.Popen([sys.executable, "-c", textwrap.dedent(BURN)])
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(HARNESS)], capture_output=True, text=True,
                              env=ENV, timeout=300)
    finally:
        burners.kill()
        burners.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.splitlines()[-1])
    sleeping, computing = outcome["calls"]
    # the sleeper is stopped by its backstop, as on an idle machine
    assert sleeping["ok"] is False and sleeping["error_kind"] == "timeout", sleeping
    assert "sleeps or waits" in sleeping["error"]
    # the computing call used a tenth of its CPU limit and is not a timeout ...
    assert computing["ok"] is True and computing["value"] == "compute", computing
    assert computing["cpu_seconds"] < PER_CALL
    # ... although its wall time was past the backstop: the starvation was real (else this test
    # could not fail on the old rule)
    assert computing["seconds"] > wall_backstop(PER_CALL), computing
    # a whole run's wall limit (3 s, no per-call limit) is no more a load meter than a call's
    ok, error, seconds = outcome["whole"]
    assert ok, error
    assert seconds > 3
