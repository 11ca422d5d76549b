"""The fork server: every execution is a fresh, fully isolated child, nothing of an earlier
candidate reaches a later one, a broken fork server falls back to a fresh sandbox, and outcomes
are the same as a fresh sandbox's. (The attack suites run through the fork server too: it is the
default, and they check that it was used.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest

from heldout.contracts import RunLimits
from heldout.sandbox import PROGRAM_PRELOAD, cgroups, cleanup, control, monitor, run_calls, run_function, zygote
from heldout.sandbox.root import SCRATCH_DIR, child_env

pytestmark = pytest.mark.skipif(not zygote.fork_server_enabled(),
                                reason="the fork server needs a root harness with cgroup v1 limits")

LIMITS = RunLimits(wall_seconds=20, cpu_seconds=20, memory_mb=512, max_processes=32)

POLLUTE = '''\
import ctypes, math, os, socket, sys, time, types
import numpy as np

libc = ctypes.CDLL(None, use_errno=True)


def reach_planted():
    fd = libc.socket(1, 1, 0)
    addr = b"\\x01\\x00\\x00heldout-planted"
    return libc.connect(fd, addr, len(addr)) == 0


def f():
    open("left_behind.txt", "w").write("candidate A was here")
    os.makedirs(os.path.expanduser("~/.config"), exist_ok=True)
    open(os.path.expanduser("~/.config/planted"), "w").write("x")
    os.environ["HELDOUT_PLANTED"] = "from A"
    os.putenv("HELDOUT_PLANTED_C", "from A")
    np.sum = lambda *a, **k: 42
    math.sqrt = lambda x: -1.0
    sys.modules["planted_module"] = types.ModuleType("planted_module")
    sys.path.insert(0, "/sandbox/scratch")
    libc.shmget(0x4845_4C44, 4096, 0o1000 | 0o666)
    if libc.fork() == 0:  # a background process, out of Python's sight, holding an abstract socket
        libc.setsid()
        fd = libc.socket(1, 1, 0)
        addr = b"\\x01\\x00\\x00heldout-planted"  # AF_UNIX, abstract name (below the audit hook)
        libc.bind(fd, addr, len(addr))
        libc.listen(fd, 1)
        time.sleep(120)
        os._exit(0)
    for _ in range(200):  # until the listener has started (it runs when it is scheduled)
        reached = reach_planted()
        if reached:
            break
        time.sleep(0.05)
    os.set_inheritable(os.open("left_behind.txt", os.O_RDONLY), True)
    return "polluted" if reached else "the background listener did not start"
'''

INSPECT = '''\
import ctypes, math, os, socket, sys
import numpy as np

libc = ctypes.CDLL(None, use_errno=True)


def f():
    fd = libc.socket(1, 1, 0)
    addr = b"\\x01\\x00\\x00heldout-planted"
    reached = libc.connect(fd, addr, len(addr)) == 0
    os.close(fd)
    return {
        "scratch": sorted(os.listdir(".")),
        "home_config": os.path.exists(os.path.expanduser("~/.config/planted")),
        "env": sorted(k for k in os.environ if k.startswith("HELDOUT")),
        "numpy_sum": int(np.sum([1, 2])),
        "sqrt": math.sqrt(4.0),
        "modules": "planted_module" in sys.modules,
        "path_scratch_first": sys.path[0] == "/sandbox/scratch",
        "shm": libc.shmget(0x4845_4C44, 0, 0) >= 0,
        "abstract_socket": reached,
        "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "uid": os.getuid(),
    }
'''


def run(source: str, **kw):
    return run_function({"prog.py": source}, "prog", "f", limits=kw.pop("limits", LIMITS),
                        preload=kw.pop("preload", PROGRAM_PRELOAD), **kw)


def test_nothing_of_a_polluting_candidate_reaches_the_next_one():
    first = run(POLLUTE)
    assert first.ok and first.value == "polluted" and first.forked, first.error
    clean = run(INSPECT)
    assert clean.ok and clean.forked, clean.error
    seen = clean.value
    assert seen["scratch"] == []  # a fresh, empty scratch (and home)
    assert seen["home_config"] is False
    assert seen["env"] == []
    assert seen["numpy_sum"] == 3 and seen["sqrt"] == 2.0  # modules as the zygote imported them
    assert seen["modules"] is False and seen["path_scratch_first"] is False
    assert seen["shm"] is False  # the IPC namespace died with the run
    assert seen["abstract_socket"] is False  # the background process and its network namespace too
    assert seen["processes"] == [2]  # the reaper and the memory holder are hidden (hidepid)
    # stdio, the result pipe, the call stream (each input arrives when its clock starts) + listdir's own
    assert seen["fds"][:5] == [0, 1, 2, 3, 4] and len(seen["fds"]) <= 6


def test_every_execution_has_its_own_uid_and_network():
    src = ("import os, socket\ndef f():\n    return [os.getuid(), os.getpid(), [n for _, n in socket.if_nameindex()],"
           " open('/proc/self/cgroup').read()]\n")
    a, b = run(src), run(src)
    assert a.ok and b.ok and a.forked and b.forked
    if os.geteuid() == 0:
        assert a.value[0] != b.value[0] and min(a.value[0], b.value[0]) >= 2_000_000
    assert a.value[1] == b.value[1] == 2
    assert a.value[2] == b.value[2] == ["lo"]
    assert all(line.endswith(":/") for line in a.value[3].split()), a.value[3]  # its own cgroup namespace


def _stocked(server: zygote.ForkServer, spares: int = 1) -> None:
    """Wait until ``spares`` of the zygote's spares wait in groups of their own (they join them
    off the executions' path, on the zygote's time: a loaded machine can take longer than any
    fixed pause)."""
    deadline = time.monotonic() + 30
    while server.spares_in_groups() < spares:
        assert time.monotonic() < deadline, f"{server.spares_in_groups()} spare(s) in a group after 30 s"
        time.sleep(0.01)


def _count_prepared_groups(monkeypatch) -> list[bool]:
    """Records, per execution, whether it went to a spare that had joined its group in advance."""
    took: list[bool] = []
    take = control.GroupStock.take_ready

    def counting(stock):
        gid, group = take(stock)
        took.append(gid is not None)
        return gid, group

    monkeypatch.setattr(control.GroupStock, "take_ready", counting)
    return took


TOGETHER_OVER_THE_LIMIT = '''\
import ctypes, os, select, time
libc = ctypes.CDLL(None, use_errno=True)


def f():
    touched_r, touched_w = os.pipe()
    pids = []
    for _ in range(4):  # each child fits the per-process limit, the four together do not
        pid = libc.fork()
        if pid == 0:
            block = bytearray(100 * 1024 * 1024)
            for i in range(0, len(block), 4096):
                block[i] = 1
            os.write(touched_w, b"+")  # all its memory is there
            libc.pause()
            os._exit(0)
        pids.append(pid)
    os.close(touched_w)
    # until one has died, or all four hold their memory and a second has passed (time for a victim
    # the kernel chose as the last one filled its memory to be gone): however long the allocations
    # take on a loaded machine (a fixed 2 s used to be the whole wait)
    alive, touched, all_touched = pids, 0, None
    give_up = time.time() + 10  # (inside the run's 20 s: a run stopped by its wall limit proves nothing)
    while len(alive) == 4 and time.time() < give_up and (all_touched is None or time.time() < all_touched + 1):
        if select.select([touched_r], [], [], 0.05)[0]:
            touched += len(os.read(touched_r, 4))
            if touched >= 4 and all_touched is None:
                all_touched = time.time()
        alive = [p for p in alive if os.waitpid(p, os.WNOHANG) == (0, 0)]
    return len(alive)  # how many are still alive
'''


def test_a_spare_joins_its_group_in_advance_and_the_request_sets_its_limits(monkeypatch):
    """The join is off the execution's path, the limits are not: in an execution whose spare was
    prepared in its group, a whole-run memory bomb stops at the request's limit (only the group
    counts the four children together), and the same bomb fits a larger one."""
    assert run("def f():\n    return 0\n").forked  # the zygote runs
    server = zygote.server_for(PROGRAM_PRELOAD)
    _stocked(server)
    took = _count_prepared_groups(monkeypatch)
    bomb = run(TOGETHER_OVER_THE_LIMIT, limits=LIMITS.replace(memory_mb=300))
    assert bomb.forked and (not bomb.ok or bomb.value < 4), (bomb.value, bomb.error)  # the kernel killed some
    _stocked(server)
    roomy = run(TOGETHER_OVER_THE_LIMIT, limits=LIMITS.replace(memory_mb=1024))
    assert roomy.ok and roomy.value == 4, (roomy.value, roomy.error)
    assert took == [True, True]


def test_a_request_that_brings_its_own_group_moves_a_prepared_spare_there(monkeypatch):
    """With no prepared spare to take (all of them taken), the request comes with a new group:
    the child of the zygote's oldest spare moves into it, and its old group is removed."""
    assert run("def f():\n    return 0\n").forked
    server = zygote.server_for(PROGRAM_PRELOAD)
    _stocked(server)  # the oldest spares are in groups: moving out of one leaves it to be removed
    monkeypatch.setattr(control.GroupStock, "take_ready", lambda self: (None, None))
    src = ("import os\ndef f():\n    return [open('/proc/self/cgroup').read(),"
           " sorted(int(p) for p in os.listdir('/proc') if p.isdigit())]\n")
    results = [run(src) for _ in range(4)]
    for r in results:
        assert r.ok and r.forked, r.error
        assert all(line.endswith(":/") for line in r.value[0].split()), r.value[0]
        assert r.value[1] == [2]  # itself: its reaper and memory holder are hidden (hidepid)
    bomb = run(TOGETHER_OVER_THE_LIMIT, limits=LIMITS.replace(memory_mb=300))
    assert bomb.forked and (not bomb.ok or bomb.value < 4), (bomb.value, bomb.error)
    assert zygote.server_for(PROGRAM_PRELOAD) is server

    def nested() -> list:
        cleanup.drain_cleanup()
        return [d for d in server.group.dirs["memory"].iterdir() if d.name.startswith("heldout-run-")]

    # the groups it left are removed, none piles up (each once the zygote's report that it is
    # empty has come and its removal run off the caller's path: a loaded machine takes a while)
    deadline = time.monotonic() + 30
    while len(nested()) > control.STOCKED_GROUPS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(nested()) <= control.STOCKED_GROUPS


def test_a_forked_child_that_says_it_is_isolated_outside_its_group_is_run_again_fresh(monkeypatch):
    """The host checks, when a forked child says it is ready, that the child is in its own group;
    a child that is not (the monitor's check says so, here by hand) is thrown away with its zygote
    and the execution runs whole in a fresh sandbox."""
    assert run("def f():\n    return 0\n").forked
    monkeypatch.setattr(monitor.RunMeter, "joined", lambda self: False)
    r = run("def f():\n    return 7\n")
    assert r.ok and r.value == 7 and not r.forked


def test_a_prepared_spare_that_died_before_its_request_is_replaced_by_the_next_one(monkeypatch):
    """A spare killed in its group after the harness took that group for a request (from outside:
    no candidate can reach a spare): the execution asks the same fork server once more and is
    forked by it (the fork server is not broken, so it is not thrown away)."""
    assert run("def f():\n    return 0\n").forked
    server = zygote.server_for(PROGRAM_PRELOAD)
    _stocked(server)
    take, killed = control.GroupStock.take_ready, []

    def take_a_dead_one(self):
        gid, group = take(self)
        if group is not None and not killed:
            group.kill_all()
            killed.append(gid)
        return gid, group

    monkeypatch.setattr(control.GroupStock, "take_ready", take_a_dead_one)
    results = [run(f"def f():\n    return {i}\n") for i in range(3)]
    assert killed
    assert [(r.ok, r.value, r.forked) for r in results] == [(True, i, True) for i in range(3)]
    assert zygote.server_for(PROGRAM_PRELOAD) is server


def _zygote_pid(server: zygote.ForkServer) -> int:
    """The host pid of the zygote's Python (its reapers and memory holders, clones of it, are its
    children; bwrap is its parent)."""
    python = os.path.realpath(sys.executable)
    parent = {}
    for p in set(_zygote_group_processes(server)):
        try:  # (an earlier execution's reaper or holder may exit between the listing and its reading)
            if os.path.realpath(f"/proc/{p}/exe", strict=True) == python:
                parent[p] = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    (pid,) = [p for p in parent if parent[p] not in parent]
    return pid


def test_a_spare_killed_before_the_zygote_reaped_it_is_not_the_fork_servers_fault(monkeypatch):
    """The race the test above can lose: the spare is killed and its request reaches the zygote
    before the zygote reaped it (the zygote is stopped meanwhile, here). The spare's memory holder
    keeps the request socket open, so the request goes out to a spare that never reads it: the
    zygote reports that no spare took it (the request still unread in the socket), and the
    execution asks the same fork server again instead of throwing it away."""
    assert run("def f():\n    return 0\n").forked
    server = zygote.server_for(PROGRAM_PRELOAD)
    _stocked(server)
    stopped_zygote = _zygote_pid(server)
    take, dispatch, killed = control.GroupStock.take_ready, control.GroupStock.dispatch, []

    def take_and_kill_its_spare(self):
        gid, group = take(self)
        if group is not None and not killed:
            group.kill_all()  # the spare is dead, and its zygote (stopped) has not reaped it
            killed.append(gid)
        return gid, group

    def dispatch_to_a_stopped_zygote(self, *args, **kwargs):
        if killed:
            return dispatch(self, *args, **kwargs)
        os.kill(stopped_zygote, signal.SIGSTOP)
        try:
            return dispatch(self, *args, **kwargs)  # the request waits in the control socket
        finally:
            os.kill(stopped_zygote, signal.SIGCONT)

    monkeypatch.setattr(control.GroupStock, "take_ready", take_and_kill_its_spare)
    monkeypatch.setattr(control.GroupStock, "dispatch", dispatch_to_a_stopped_zygote)
    r = run("def f():\n    return 3\n")
    assert killed and (r.ok, r.value, r.forked) == (True, 3, True), r.error
    assert zygote.server_for(PROGRAM_PRELOAD) is server


def test_the_group_of_an_execution_no_spare_took_is_removed_and_what_is_in_it_lives(monkeypatch):
    """An execution the zygote had no spare for never had a process, but its group may hold
    another execution's spare, moving out (a request that brought its own group was handed it):
    that group is removed once empty, never killed. The execution itself asks again and runs."""
    assert run("def f():\n    return 0\n").forked
    server = zygote.server_for(PROGRAM_PRELOAD)
    group = cgroups.RunGroup.create(memory_mb=None, max_processes=None, parent=server.group)
    other = subprocess.Popen(["sleep", "30"])  # stands for the other execution's spare
    try:
        for procs in group.files.procs:
            with open(procs, "w") as fh:
                fh.write(str(other.pid))
        take, taken = control.GroupStock.take_ready, []

        def a_group_no_spare_is_in(self):
            if not taken:
                taken.append(True)
                return 10 ** 6, group  # an id the zygote has no spare for: it answers "no spare"
            return take(self)

        monkeypatch.setattr(control.GroupStock, "take_ready", a_group_no_spare_is_in)
        r = run("def f():\n    return 5\n")
        assert taken and r.ok and r.value == 5 and r.forked
        assert zygote.server_for(PROGRAM_PRELOAD) is server
        cleanup.drain_cleanup()
        assert other.poll() is None  # alive: the group was not killed
    finally:
        other.kill()
        other.wait()
        group.close()


def test_an_execution_no_spare_took_asks_again_without_throwing_the_fork_server_away(monkeypatch):
    """Concurrent requests can leave one with no spare for a moment (one that brought its own
    group was handed the spare of the group another had taken): that is no fault of the zygote's.
    The execution asks again, as often as it takes within a bound, and runs forked; the zygote
    stays. (Throwing it away used to turn the concurrent runs into fresh ones.)"""
    assert run("def f():\n    return 0\n").forked
    server = zygote.server_for(PROGRAM_PRELOAD)
    take, refused = control.GroupStock.take_ready, []

    def a_group_no_spare_is_in(self):
        if len(refused) < 3:
            refused.append(True)
            return 10 ** 6 + len(refused), cgroups.RunGroup.create(memory_mb=None, max_processes=None,
                                                                   parent=self.outer)
        return take(self)

    monkeypatch.setattr(control.GroupStock, "take_ready", a_group_no_spare_is_in)
    r = run("def f():\n    return 6\n")
    assert len(refused) == 3 and (r.ok, r.value, r.forked) == (True, 6, True), r.error
    assert zygote.server_for(PROGRAM_PRELOAD) is server


def test_random_states_are_not_shared_between_executions():
    src = "import random\nimport numpy as np\ndef f():\n    return [random.random(), float(np.random.random())]\n"
    a, b = run(src), run(src)
    assert a.ok and b.ok and a.forked
    assert a.value[0] != b.value[0] and a.value[1] != b.value[1]


HELPER = "STATE = {'calls': 0}\nVALUE = %d\n"
USES_HELPER = """
import os, sys
import shared_helper
def f():
    shared_helper.STATE["calls"] += 1
    shared_helper.VALUE += 100
    return {"value": shared_helper.VALUE, "calls": shared_helper.STATE["calls"],
            "preloaded_file_visible": os.path.exists(shared_helper.__file__),
            "from_code_dir": shared_helper.__file__ == os.path.join(sys.path[0], "shared_helper.py")}
"""


def run_with_helper(value: int, preload=PROGRAM_PRELOAD + ("shared_helper",)):
    return run_function({"prog.py": USES_HELPER}, "prog", "f", limits=LIMITS, preload=preload,
                        setup_files={"shared_helper.py": HELPER % value})


def test_a_task_helper_named_in_the_preload_is_imported_by_the_zygote_from_its_text():
    first = run_with_helper(1)
    assert first.ok and first.forked, first.error
    # imported before the fork, from a folder of the zygote's that the child's code dir covers
    assert first.value == {"value": 101, "calls": 1, "preloaded_file_visible": False, "from_code_dir": False}
    # what the first candidate did to the module's state is gone: each child has the zygote's copy
    again = run_with_helper(1)
    assert again.ok and again.value == first.value
    # another text of the helper is another zygote: never the module of a different text
    other = run_with_helper(2)
    assert other.ok and other.forked and other.value["value"] == 102
    # not named in the preload: the child imports the execution's own copy, as a fresh sandbox does
    own = run_with_helper(3, preload=PROGRAM_PRELOAD)
    assert own.ok and own.value["value"] == 103 and own.value["from_code_dir"] is True


def test_only_top_level_python_helpers_named_in_the_preload_are_preloaded(tmp_path):
    data = tmp_path / "table.py"
    data.write_text("X = 1\n")
    files = {"a.py": "A = 1\n", "pkg/b.py": "B = 1\n", "c.py": "C = 1\n", "table.py": data, "d.txt": "d"}
    chosen = zygote.Preload.of(["numpy", "a", "b", "pkg/b", "table", "d"], files)
    assert chosen.modules == ("a", "b", "d", "numpy", "pkg/b", "table")
    assert chosen.helpers == (("a.py", "A = 1\n"),)
    # another text of a helper is another preload set (another zygote)
    assert zygote.Preload.of(["a"], {"a.py": "A = 2\n"}) != zygote.Preload.of(["a"], {"a.py": "A = 1\n"})
    assert zygote.Preload.of(["numpy"]) == zygote.Preload(("numpy",))


def test_outcomes_match_a_fresh_sandbox():
    programs = {
        "value": "def f(x):\n    return {'sq': x * x, 't': (1, 2)}\n",
        "crash": "def f(x):\n    return 1 / 0\n",
        "bad_output": "def f(x):\n    return object()\n",
        "memory": "def f(x):\n    return bytearray(10 ** 10)\n",
        "forbidden": "import subprocess\ndef f(x):\n    subprocess.run(['true'])\n",
        "exit": "import os\ndef f(x):\n    os._exit(3)\n",
    }
    for name, src in programs.items():
        forked = run_calls({"prog.py": src}, "prog", "f", [([3], {})], limits=LIMITS, preload=PROGRAM_PRELOAD)
        fresh = run_calls({"prog.py": src}, "prog", "f", [([3], {})], limits=LIMITS, fork_server=False)
        assert forked.forked and not fresh.forked, name
        assert (forked.ok, forked.value, forked.error_kind) == (fresh.ok, fresh.value, fresh.error_kind), name
        assert forked.isolation == fresh.isolation, name


def test_a_per_call_timeout_goes_on_in_a_new_child_of_the_fork_server():
    src = ("import signal, time\ndef f(x):\n    if x == 1:\n        signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
           "        time.sleep(30)\n    return x\n")
    r = run_calls({"prog.py": src}, "prog", "f", [([0], {}), ([1], {}), ([2], {})], limits=LIMITS,
                  per_call_seconds=[0.5] * 3, preload=PROGRAM_PRELOAD)
    assert [c["ok"] for c in r.calls] == [True, False, True] and r.forked
    assert "enforced by the parent" in r.calls[1]["error"]


def test_a_dead_fork_server_is_replaced_and_the_execution_still_runs():
    assert run("def f():\n    return 1\n").forked
    server = zygote.server_for(PROGRAM_PRELOAD)
    assert server is not None
    server.proc.kill()
    server.proc.wait()
    r = run("def f():\n    return 2\n")
    assert r.ok and r.value == 2
    assert zygote.server_for(PROGRAM_PRELOAD) is not server


def _in_the_program(monkeypatch) -> threading.Event:
    """Set once the next run's child said it is ready (its program is running)."""
    ready, feed = threading.Event(), monitor.RunState.feed

    def watched(state, chunk):
        feed(state, chunk)
        if state.ready:
            ready.set()

    monkeypatch.setattr(monitor.RunState, "feed", watched)
    return ready


def _while_a_program_runs(monkeypatch, value: int, act) -> tuple:
    """Run a program that sleeps 1 s and returns ``value``; once it runs, ``act(server)`` on its
    zygote. Returns the run's result and that zygote."""
    assert run("def f():\n    return 0\n").forked
    server = zygote.server_for(PROGRAM_PRELOAD)
    ready = _in_the_program(monkeypatch)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(run, f"import time\ndef f():\n    time.sleep(1.0)\n    return {value}\n")
        assert ready.wait(30)
        act(server)
        return pending.result(timeout=60), server


def test_a_fork_server_thrown_away_while_it_runs_an_execution_lets_that_execution_finish(monkeypatch):
    # one execution's fork-server failure throws the zygote away; another execution it is running
    # (checked in its own group, under its own limits) finishes there, and only then is it closed
    r, server = _while_a_program_runs(monkeypatch, 5, lambda s: zygote.discard(s, "thrown away by the test"))
    assert (r.ok, r.value, r.forked) == (True, 5, True), r.error
    deadline = time.monotonic() + 10
    while server.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.proc.poll() is not None  # closed after its last execution
    assert zygote.server_for(PROGRAM_PRELOAD) is not server


def test_an_execution_whose_fork_server_dies_under_it_runs_again_in_a_fresh_sandbox(monkeypatch):
    # the zygote's runs die with it: the program did not end its run, so it is not blamed for it
    r, _ = _while_a_program_runs(monkeypatch, 6, lambda s: s.proc.kill())
    assert (r.ok, r.value, r.forked) == (True, 6, False), r.error


def test_a_run_that_exited_before_the_parent_read_its_ready_message_still_counts_as_forked(monkeypatch):
    # a busy parent reads "ready" only after the child finished and left its cgroup: the
    # group's charges prove it was there, so the fork server is kept (it was thrown away before)
    feed = monitor.RunState.feed

    def slow_feed(state, chunk):
        time.sleep(0.3)
        feed(state, chunk)

    assert run("def f():\n    return 0\n").forked
    server = zygote.server_for(PROGRAM_PRELOAD)
    monkeypatch.setattr(monitor.RunState, "feed", slow_feed)
    results = [run(f"def f():\n    return {i}\n") for i in range(3)]
    assert [(r.ok, r.value, r.forked) for r in results] == [(True, i, True) for i in range(3)]
    assert zygote.server_for(PROGRAM_PRELOAD) is server


def test_a_run_that_forges_done_and_keeps_running_is_ended_through_the_fork_server():
    # the candidate claims to be done on the result channel, then goes on: the parent ends it
    # through the zygote, whose exit report must come (a missing report throws the zygote away)
    src = ("import json, os, time\ndef f():\n"
           "    os.write(3, (json.dumps({'call': 0, 'ok': True, 'value': 7}) + '\\n' + json.dumps({'done': True})"
           " + '\\n').encode())\n    time.sleep(60)\n")
    assert run("def f():\n    return 0\n").forked
    server = zygote.server_for(PROGRAM_PRELOAD)
    r = run(src)
    assert r.forked and r.ok and r.value == 7  # the raw channel's claim; tasks recompute every score
    assert server.alive() and zygote.server_for(PROGRAM_PRELOAD) is server
    assert run("def f():\n    return 1\n").value == 1


def test_a_fork_server_that_cannot_set_up_a_child_falls_back_to_a_fresh_sandbox(monkeypatch):
    # the zygote is told to bind a code dir that does not exist: its child cannot be set up
    monkeypatch.setattr(zygote, "CODE_DIR", "/sandbox/no-such-dir")
    zygote.shutdown()
    r = run("def f():\n    return 'fresh'\n")
    assert r.ok and r.value == "fresh" and not r.forked
    monkeypatch.undo()
    zygote.shutdown()
    assert run("def f():\n    return 'forked'\n").forked


def test_the_opt_out_runs_a_fresh_sandbox(monkeypatch):
    assert not run("def f():\n    return 1\n", fork_server=False).forked
    monkeypatch.setenv(zygote.FORK_SERVER_ENV, "0")
    r = run("def f():\n    return 1\n")
    assert r.ok and not r.forked


FIRST_EXECUTION = """
import sys
from heldout.contracts import RunLimits
from heldout.sandbox import PROGRAM_PRELOAD, root, run_function, zygote

early, started = [], []
real_start_early, real_server = zygote.start_early, zygote.ForkServer


class Counted(real_server):
    def __init__(self, preload):
        started.append(preload)
        super().__init__(preload)


def start_early(preload):
    early.append(root.bwrap_probed())
    real_start_early(preload)


zygote.ForkServer = Counted
sys.modules["heldout.sandbox.launcher"].start_early = start_early
r = run_function({"p.py": "def f():\\n    return 7\\n"}, "p", "f", limits=RunLimits(wall_seconds=20),
                 preload=PROGRAM_PRELOAD)
again = run_function({"p.py": "def f():\\n    return 8\\n"}, "p", "f", limits=RunLimits(wall_seconds=20),
                     preload=PROGRAM_PRELOAD)
print(r.value, r.forked, again.value, again.forked, early, len(started))
"""


def test_the_first_execution_of_a_process_starts_its_zygote_while_the_sandbox_is_probed():
    """One zygote, begun before the probe had its answer, then handed to the first execution
    (and the next); later executions do not start another."""
    out = subprocess.run([sys.executable, "-c", FIRST_EXECUTION], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["7", "True", "8", "True", "[False]", "1"]


def test_concurrent_executions_share_one_fork_server_and_nothing_else():
    src = ("import os, time\ndef f(i):\n    open(f'mine{i}', 'w').write('x')\n    time.sleep(0.3)\n"
           "    return [sorted(os.listdir('.')), sorted(p for p in os.listdir('/proc') if p.isdigit())]\n")
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda i: run_function({"prog.py": src}, "prog", "f", [i], limits=LIMITS,
                                                       preload=PROGRAM_PRELOAD), range(3)))
    for i, r in enumerate(results):
        assert r.ok and r.forked, r.error
        assert r.value == [[f"mine{i}"], ["2"]]  # itself (its reaper and memory holder are hidden)


COLD_CONCURRENT = """
from concurrent.futures import ThreadPoolExecutor
from heldout.contracts import RunLimits
from heldout.sandbox import PROGRAM_PRELOAD, run_function
src = "import time\\ndef f(i):\\n    time.sleep(0.2)\\n    return i\\n"
with ThreadPoolExecutor(3) as pool:
    results = list(pool.map(lambda i: run_function({"p.py": src}, "p", "f", [i], limits=RunLimits(wall_seconds=20),
                                                    preload=PROGRAM_PRELOAD), range(3)))
quick = "def f(i):\\n    return i\\n"
results += [run_function({"p.py": quick}, "p", "f", [i], limits=RunLimits(), preload=PROGRAM_PRELOAD)
            for i in range(3, 8)]
print([(r.value, r.forked) for r in results])
"""


def test_concurrent_first_executions_of_a_process_all_run_forked():
    """More executions at once than prepared spares, in a process whose zygote is just starting:
    the spares' groups are still being joined while requests that bring their own group take
    those spares (and the harness removes the groups they leave). Every execution runs forked;
    none is thrown back to a fresh sandbox. (Once in about eight such processes one was.) Then
    quick executions back to back, each handed to a spare that may have said it is ready an
    instant before (its word unread when the request goes out: once, that lost the request)."""
    for _ in range(4):
        out = subprocess.run([sys.executable, "-c", COLD_CONCURRENT], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == str([(i, True) for i in range(8)])


def _run_in_a_forked_worker() -> tuple[object, dict]:
    result = run_function({"prog.py": "import os\ndef f():\n    return 'child ran'\n"}, "prog", "f",
                          limits=LIMITS, preload=PROGRAM_PRELOAD)
    return result.value, zygote.stats()


def test_a_process_forked_after_the_fork_server_started_runs_its_own():
    """A process-pool worker forked from a harness that already runs a zygote (the harness's start
    thread and zygotes are not copied into it) starts its own instead of waiting forever on the
    parent's, and never sends executions down the parent's control socket."""
    assert run_function({"prog.py": "def f():\n    return 1\n"}, "prog", "f", limits=LIMITS,
                        preload=PROGRAM_PRELOAD).value == 1
    before = zygote.stats()
    assert before["servers"] >= 1
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        value, child_stats = pool.submit(_run_in_a_forked_worker).result(timeout=120)
    assert value == "child ran"
    assert child_stats == {"servers": 1, "executions": 1}  # its own zygote, its own count
    assert zygote.stats()["servers"] == before["servers"]


def test_a_forked_child_has_exactly_the_environment_of_a_fresh_sandbox():
    """Both get ``child_env`` (PWD included: bwrap sets it in a fresh sandbox), so a forked child
    has nothing of its zygote's environment to reset, and a program cannot tell them apart."""
    src = "import os\ndef f():\n    return dict(os.environ)\n"
    fresh, forked = run(src, fork_server=False), run(src)
    assert forked.forked and not fresh.forked
    assert forked.value == fresh.value == child_env(SCRATCH_DIR)


def test_a_candidate_cannot_reach_its_reaper_or_its_memory_holder():
    """PID 1 of an execution's namespace is a clone sharing the zygote's memory and file table
    (the control socket among its fds); PID 3 is a clone sharing the candidate's own memory, with
    copies of the zygote's log and the spare's request socket among its fds. For each of them,
    reading or writing its memory, listing or duplicating its fds, or signalling it must fail;
    neither runs a signal handler (every catchable signal is blocked); and the next execution
    still runs."""
    src = '''
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
def f():
    seen = {}
    for pid in (1, 3):  # not listed in /proc (hidepid): named by number
        got = seen[str(pid)] = {}
        for name, act in [("mem", lambda: open(f"/proc/{pid}/mem", "r+b")),
                          ("fds", lambda: os.listdir(f"/proc/{pid}/fd")),
                          ("maps", lambda: open(f"/proc/{pid}/maps").read()),
                          ("environ", lambda: open(f"/proc/{pid}/environ").read())]:
            try:
                act()
                got[name] = "reached"
            except OSError as exc:
                got[name] = exc.errno
        got["listed"] = str(pid) in os.listdir("/proc")
        try:
            open(f"/proc/{pid}/status").read()
            got["status"] = "reached"
        except OSError as exc:
            got["status"] = exc.errno
        pidfd = libc.syscall(434, pid, 0)  # pidfd_open
        got["pidfd_getfd"] = [libc.syscall(438, pidfd, fd, 0) for fd in range(3, 12)] if pidfd >= 0 else "no pidfd"
        # below the audit hook, which would end the run at os.kill
        got["kill"] = [libc.kill(pid, sig) for sig in (signal.SIGTERM, signal.SIGSEGV, signal.SIGKILL)]
    return seen
'''
    r = run(src)
    assert r.ok and r.forked, r.error
    assert sorted(r.value) == ["1", "3"], r.value  # JSON keys
    for pid, got in r.value.items():
        # nothing of theirs is there: /proc is mounted hidepid=2 (the holder's maps, its memory's
        # layout, were readable: the kernel lets a process read the maps of its own memory)
        assert "reached" not in got.values() and got["listed"] is False, (pid, got)
        assert got["maps"] == got["status"] == 2, (pid, got)  # ENOENT: hidden, not only refused
        assert got["pidfd_getfd"] == "no pidfd" or all(fd < 0 for fd in got["pidfd_getfd"]), (pid, got)
        assert got["kill"] == [-1, -1, -1], (pid, got)
    after = run("def f():\n    return 7\n")
    assert after.ok and after.forked and after.value == 7


def _zygote_group_processes(server: zygote.ForkServer) -> list[int]:
    """The processes in the fork server's own group (its executions' groups are nested in it):
    bwrap, the zygote, and each spare's or finished execution's reaper and memory holder."""
    return [int(p) for d in server.group.dirs.values() for p in open(f"{d}/cgroup.procs").read().split()]


def test_finished_executions_leave_nothing_behind_in_the_fork_server():
    """Every execution's reaper and memory holder are gone some time after it finished (the
    holder tears the child's memory down at a low priority, after the exit was reported): after
    twenty executions, one of them killed for its time, the fork server's group holds as many
    processes as before them. A spare counts three processes there without a group of its own
    (its child too) and two with one, so the count compared adds the spares in groups."""
    assert run("def f():\n    return 0\n").forked
    server = zygote.server_for(PROGRAM_PRELOAD)
    time.sleep(0.5)

    def resident() -> int:
        return len(set(_zygote_group_processes(server))) + server.spares_in_groups()

    before = resident()
    for i in range(19):
        r = run(f"def f():\n    held = [bytearray(1 << 20) for _ in range({i % 5})]\n    return len(held)\n")
        assert r.ok and r.forked and r.value == i % 5, r.error
    slow = run("import time\ndef f():\n    time.sleep(30)\n", limits=LIMITS.replace(wall_seconds=1))
    assert not slow.ok and slow.error_kind == "timeout" and slow.forked, slow.error
    deadline = time.monotonic() + 20
    while resident() != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert resident() == before
    assert zygote.server_for(PROGRAM_PRELOAD) is server
