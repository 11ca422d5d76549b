"""Attack suite, task-specific: a VLIW kernel that rebuilds the held-out instances, MBPP+
solutions that ignore the per-test timer, a slow DuckDB scorer, and forged per-call timing.
Every attack must score 0 with a clear, named error."""

from __future__ import annotations

import hashlib

import pytest

from heldout import load_task
from heldout.benchmarks.lockpicking.task import BENCHMARK as LOCKPICKING
from heldout.benchmarks.mbpp_plus.execution import check_solution, load_problems
from heldout.benchmarks.vliw.task import VliwTakehome
from heldout.contracts import RunLimits
from heldout.sandbox import isolation_mode, run_calls

pytestmark = pytest.mark.skipif(isolation_mode() != "bwrap", reason="the allow-list sandbox needs bubblewrap")


def old_test_seed(k: int) -> int:
    """The formula heldout's hidden VLIW seeds used to come from (public in its source)."""
    return int(hashlib.sha256(f"heldout/vliw/takehome/test/{k}".encode()).hexdigest()[:12], 16)


REBUILDER = '''
import hashlib
from _heldout_vliw_benchmark import make_instance


class KernelBuilder:
    """Rebuilds the hidden instance from the generator shipped next to it and hard-codes its answer."""

    def build_kernel(self, forest_height, n_nodes, batch_size, rounds):
        seed = int(hashlib.sha256(b"heldout/vliw/takehome/test/0").hexdigest()[:12], 16)
        mem, expected = make_instance(seed, forest_height=forest_height, batch_size=batch_size, rounds=rounds)
        self.instrs = [{"load": [("const", 0, mem[6]), ("const", 1, 1)]}]
        for v in expected:
            self.instrs.append({"load": [("const", 2, v)]})
            self.instrs.append({"store": [("store", 0, 2)], "alu": [("+", 0, 0, 1)]})
        self.instrs.append({"flow": [("halt",)]})
'''


def test_a_vliw_kernel_that_rebuilds_the_test_instances_scores_zero_on_fresh_ones():
    bench = VliwTakehome()
    candidate = {"perf_takehome.py": REBUILDER}
    # control: on the instance it rebuilt, the lookup table is "perfect"
    seed = old_test_seed(0)
    control = bench.run(candidate, bench.make_example(f"seed-{seed}", seed))
    assert control.valid and control.score > 1.0
    # the held-out slots draw fresh seeds: the same kernel is wrong on every one of them
    verdicts = [bench.run(candidate, slot) for slot in load_task("vliw/takehome").split("test")]
    assert all(not v.valid and v.score == 0.0 and v.error_kind == "wrong_values" for v in verdicts)
    assert bench.aggregate(verdicts) == 0.0
    assert len({v.output["seed"] for v in verdicts}) == len(verdicts)  # recorded, all different


# -- MBPP+: the per-test limit is the parent's -------------------------------------------------------
@pytest.fixture(scope="module")
def problem(data_dir):
    return {p["task_id"]: p for p in load_problems(data_dir / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl")}["Mbpp/17"]


SIGNAL_IGNORING = {
    "ignores_sigalrm": "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                       "def square_perimeter(a):\n    time.sleep(30)\n    return 4 * a\n",
    "blocks_every_signal": "import signal, time\ndef square_perimeter(a):\n"
                           "    signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals))\n"
                           "    t = time.time()\n    while time.time() - t < 30:\n        pass\n    return 4 * a\n",
    "swallows_the_timeout": "import time\ndef square_perimeter(a):\n    while True:\n        try:\n"
                            "            time.sleep(30)\n            return 4 * a\n        except BaseException:\n"
                            "            pass\n",
    "disarms_the_timer": "import signal, time\ndef square_perimeter(a):\n"
                         "    signal.setitimer(signal.ITIMER_REAL, 0)\n    time.sleep(30)\n    return 4 * a\n",
}


@pytest.mark.parametrize("name", sorted(SIGNAL_IGNORING))
def test_an_mbpp_solution_that_dodges_the_per_test_timer_still_times_out(problem, name):
    limits = RunLimits(wall_seconds=60, cpu_seconds=60, memory_mb=4096)
    result = check_solution(problem, SIGNAL_IGNORING[name], which=("base",), limits=limits)
    fail = result.first_failure()
    assert result.base.status == "fail" and fail["reason"] == "timeout", fail
    assert "per-call" in fail["message"]


# a program's way to write lines of its own to the result channel (one of the fds 3-19)
FORGE = ("import os\ndef forge(data):\n    for fd in range(3, 20):\n        try:\n            os.write(fd, data)\n"
         "        except OSError:\n            pass\n")


def test_forged_start_lines_do_not_buy_a_call_more_time():
    source = (FORGE + "import time\ndef f(x):\n    forge(b'{\"start\": 0}\\n{\"start\": 1}\\n')\n"
              "    signal_free = time.time()\n    while time.time() - signal_free < 30:\n"
              "        try:\n            while True:\n                pass\n"
              "        except BaseException:\n            pass\n    return x\n")
    r = run_calls({"prog.py": source}, "prog", "f", [([0], {}), ([1], {})], limits=RunLimits(wall_seconds=20),
                  per_call_seconds=[0.5, 0.5])
    assert not r.ok and r.error_kind == "timeout" and "per-call" in r.error
    assert all(not c["ok"] for c in r.calls)


def test_forged_outcome_lines_for_later_calls_do_not_restart_the_running_calls_clock():
    """Only the outcome of the call being timed counts: forged outcomes for later calls, every
    0.3 s, each naming the running call as the next to start, change nothing (were they taken,
    each would give the first call another 0.5 s; the others return at once)."""
    source = (FORGE + "import time\ndef f(x):\n    for k in range(1, 40 if x == 0 else 1):\n"
              "        forge(b'{\"call\": %d, \"ok\": true, \"value\": 1, \"next\": 0}\\n' % k)\n"
              "        try:\n            began = time.process_time()\n"
              "            while time.process_time() - began < 0.3:\n                pass\n"
              "        except BaseException:\n            pass\n    return x\n")
    r = run_calls({"prog.py": source}, "prog", "f", [([i], {}) for i in range(40)], limits=RunLimits(wall_seconds=20),
                  per_call_seconds=[0.5] * 40)
    assert not r.ok and r.error_kind == "timeout" and "per-call" in r.error
    # stopped by its own per-call clock (restarted by each forged line, it would have run its
    # 11.7 s of CPU and returned): said by its outcome, not by the run's wall time (2-4 s here,
    # by the machine's load)
    assert not r.calls[0]["ok"] and "per-call" in r.calls[0]["error"], r.calls[0]


# ignores the per-call timers' signals (CPU: SIGPROF, the wall backstop: SIGALRM) and computes
SIGNAL_DODGER = ("import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                 "signal.signal(signal.SIGPROF, signal.SIG_IGN)\n"
                 "def wait(seconds):\n    began = time.process_time()\n"
                 "    while time.process_time() - began < seconds:\n        pass\n")


def test_lines_forged_at_import_for_the_last_call_do_not_switch_off_the_per_call_clocks():
    """At import, before any call starts, the program announces the last call's start and its
    outcome (it can read its inputs, so the value could be right). Were the start taken, no later
    start would be (calls start in order) and no call would be timed by the parent."""
    source = (FORGE + SIGNAL_DODGER + "forge(b'{\"start\": 2}\\n{\"call\": 2, \"ok\": true, \"value\": 2}\\n')\n"
              "def f(x):\n    if x == 0:\n        wait(30)\n    return x\n")
    r = run_calls({"prog.py": source}, "prog", "f", [([i], {}) for i in range(3)], limits=RunLimits(wall_seconds=20),
                  per_call_seconds=[0.5] * 3)
    assert not r.ok and r.error_kind == "timeout" and "per-call" in r.error
    # timed per call (untimed, it would have run until the run's 20 s wall limit), said by its
    # outcome, not by the run's wall time
    assert r.calls[0]["error_kind"] == "timeout" and "per-call" in r.calls[0]["error"], r.calls[0]


def test_a_forged_outcome_of_the_running_call_starts_the_next_calls_clock():
    """The program claims its own call's outcome at once and then stays in that call computing
    for 3 s of CPU (say, the next answers ahead): the next call's clock runs from the claim, so
    the work is not free. Were the claim to stop the clock until the child's next line, the 3 s
    would be timed by nobody."""
    source = (FORGE + SIGNAL_DODGER + "def f(x):\n    if x == 0:\n"
              "        forge(b'{\"call\": 0, \"ok\": true, \"value\": 0}\\n')\n        wait(3)\n    return x\n")
    r = run_calls({"prog.py": source}, "prog", "f", [([0], {}), ([1], {})], limits=RunLimits(wall_seconds=20),
                  per_call_seconds=[10.0, 0.5])
    assert not r.ok and r.error_kind == "timeout" and "per-call" in r.error
    # timed on the CPU the work used (the 3 s of it ran on call 1's clock), not on the wall, which
    # load stretches: the same run took 1.5 s of wall at load 8 and 3.4 s at load 14
    assert r.calls[0]["ok"] and r.calls[1]["error_kind"] == "timeout" and "over 0.5 s cpu" in r.calls[1]["error"]


def test_a_forged_outcome_cannot_say_the_parent_enforced_its_timeout():
    """Only the parent marks a call it timed out itself (the run then goes on in a new sandbox):
    the keys of an outcome line beyond the child's own are dropped."""
    source = (FORGE + "def f(x):\n    if x == 0:\n"
              "        forge(b'{\"call\": 0, \"ok\": false, \"error_kind\": \"timeout\", \"error\": \"late\", "
              "\"parent_enforced\": true}\\n')\n    return x\n")
    r = run_calls({"prog.py": source}, "prog", "f", [([i], {}) for i in range(3)], limits=RunLimits(wall_seconds=20),
                  per_call_seconds=[5.0] * 3)
    assert r.calls[0]["error_kind"] == "timeout" and "parent_enforced" not in r.calls[0]
    assert [c["ok"] for c in r.calls] == [False, True, True]


def test_a_forged_typed_value_that_builds_nothing_is_a_bad_output_not_a_harness_error():
    source = (FORGE + "def f():\n    forge(b'{\"call\": 0, \"ok\": true, \"value\": {\"__set__\": [[1]]}}\\n')\n"
              "    return 1\n")
    r = run_calls({"prog.py": source}, "prog", "f", [([], {})], limits=RunLimits(wall_seconds=20), encoding="typed")
    assert not r.ok and r.error_kind == "bad_output" and "invalid data" in r.error


# -- Lockpicking SQL -----------------------------------------------------------------------------------
def test_a_slow_sql_scorer_stops_at_its_timeout_in_the_sandbox():
    # slow on any machine: a regex over 1,200 characters per string takes longer than 8 s for
    # the 10^6 strings here (the champion itself now finishes its check within 0.3 s)
    slow = {"scorer.sql": "CAST(REGEXP_COUNT(CONCAT(" + ", ".join(["PROGRAM"] * 200) + "), '(0|1|2)+3') AS VARCHAR)"}
    result = LOCKPICKING.exhaustive(slow, RunLimits(wall_seconds=0.5, cpu_seconds=0.5))
    assert result["exhaustive_accuracy"] is None
    assert "timeout after 0.5 s wall" in result["exhaustive_error"]


def test_a_sql_scorer_cannot_read_files_even_if_it_got_past_the_checker(data_dir):
    """The checker refuses file functions; below it, DuckDB runs in the sandbox with external
    access off, where the data files do not exist anyway."""
    from heldout.benchmarks.lockpicking import sql as sqlmod

    sources = data_dir / "SOURCES.md"
    with pytest.raises(sqlmod.SqlExecutionError, match="file system operations are disabled") as refused:
        sqlmod._in_sandbox("run_rows", [f"(SELECT count(*) FROM read_csv('{sources}'))", ["1"], 256],
                           limits=RunLimits(cpu_seconds=10, memory_mb=256))
    assert refused.value.kind == "crash"  # the candidate's, not the harness's
    assert sources.is_file()  # the control: the file is real
