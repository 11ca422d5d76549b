"""Adversarial programs, each run as a real candidate of ``circle_packing/square26``.

Convention: an attack program returns the (valid) seed packing only if its attack *worked*, so a
score of 0 together with a named error proves the attack failed. After every case the evaluator
must be unharmed: this process alive, heldout's files unchanged, a normal evaluation still valid."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from heldout.contracts import RunLimits
from heldout.benchmarks.registry import get_benchmark
from heldout.sandbox import isolation_mode, zygote

TASK = "circle_packing/square26"
FAST = RunLimits(wall_seconds=2.5, cpu_seconds=2.5, memory_mb=512, max_processes=32)
# Output-limit attacks get generous time limits so a loaded machine cannot turn them into timeouts:
# the outcome must depend on the bytes produced, never on how fast they were produced.
UNHURRIED = FAST.replace(wall_seconds=120, cpu_seconds=120, max_output_bytes=1024 * 1024)
REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "heldout" / "data_manifests" / "circle_packing" / "square26.json"
SCORING = REPO / "heldout" / "benchmarks" / "geometry" / "scoring.py"
NAMESPACED = isolation_mode() == "bwrap"

HEADER = '''\
import os, sys, time, ctypes, socket, signal
import numpy as np


def seed():
    rows = [[0.1 + 0.2 * i, 0.1 + 0.2 * j, 0.0999] for i in range(5) for j in range(5)]
    return np.array(rows + [[0.0, 0.0, 0.0]])


def circle_packing26():
'''


def attack(body: str, limits: RunLimits = FAST, **params: str):
    text = HEADER + "".join(f"    {line}\n" for line in body.format(**params).splitlines())
    bench = get_benchmark(TASK)
    return bench.run({"program.py": text}, bench.load_raw(None)[0], bench.context(limits))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def evaluator_unharmed():
    before = {p: digest(p) for p in (MANIFEST, SCORING)}
    yield
    assert {p: digest(p) for p in before} == before
    bench = get_benchmark(TASK)
    again = bench.run(bench.seed_candidate(), bench.load_raw(None)[0], bench.context(FAST.replace(wall_seconds=30, cpu_seconds=30)))
    assert again.valid and again.score == pytest.approx(2.4975)


@pytest.fixture(autouse=True)
def through_the_fork_server(evaluator_unharmed):
    """Every attack here runs in a child of the fork server (the default) when it is available."""
    before = zygote.stats()["executions"]
    yield
    if zygote.fork_server_enabled():
        assert zygote.stats()["executions"] > before, "the attack did not run through the fork server"


def failed(verdict, *kinds: str):
    assert verdict.score == 0.0 and not verdict.valid, verdict
    assert verdict.error and verdict.error_kind in kinds, (verdict.error_kind, verdict.error)
    assert "limits:" in verdict.feedback  # the limits are printed in every verdict


def no_process_named(token: str, settle_seconds: float = 2.0) -> bool:
    """No live process is named ``token``. A zombie (killed, not yet reaped by its namespace's
    init) is dead; on a loaded machine the kernel may take a moment to tear a killed tree down
    (CI once saw the daemon's entry right after the run), so this looks again for a short while."""
    give_up = time.monotonic() + settle_seconds
    while True:
        alive = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == token:
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                    alive = alive or state not in ("Z", "X")
            except (OSError, IndexError):
                continue
        if not alive or time.monotonic() > give_up:
            return not alive
        time.sleep(0.05)


# -- time ---------------------------------------------------------------------------------------
def test_infinite_loop_is_killed_at_the_wall_limit():
    # the CPU limit well above the wall's: with both at 2.5 s, which fired first on an idle machine
    # depended on how late the parent saw the wall clock pass (the child had used ~2.3 s of CPU by then)
    v = attack("while True:\n    pass", limits=FAST.replace(cpu_seconds=10))
    failed(v, "timeout")
    assert "2.5 s wall" in v.error


def test_sleep_is_killed_at_the_wall_limit():
    failed(attack("time.sleep(3600)\nreturn seed()"), "timeout")


def test_cpu_limit_below_wall_limit_stops_a_busy_program():
    v = attack("x = 0\nwhile True:\n    x += 1", limits=FAST.replace(wall_seconds=20, cpu_seconds=1))
    failed(v, "timeout")
    assert "cpu" in v.error


def test_ignoring_signals_does_not_survive_the_wall_limit():
    failed(attack("for s in (signal.SIGTERM, signal.SIGALRM, signal.SIGXCPU, signal.SIGINT):\n"
                  "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"), "timeout")


# -- processes ------------------------------------------------------------------------------------
def test_fork_bomb_through_os_fork_is_forbidden():
    failed(attack("while True:\n    os.fork()"), "forbidden")


def test_spawning_a_shell_is_forbidden():
    failed(attack("import subprocess\nsubprocess.run(['sh', '-c', 'echo pwned'])\nreturn seed()"), "forbidden")


def test_fork_bomb_through_libc_is_contained_and_leaves_no_process():
    token = "hb" + uuid.uuid4().hex[:10]
    body = ("libc = ctypes.CDLL(None)\nlibc.prctl(15, {token!r}.encode(), 0, 0, 0)\n"
            "for _ in range(100000):\n    libc.fork()\ntime.sleep(60)\nreturn seed()")
    failed(attack(body, token=token), "timeout", "crash")
    assert no_process_named(token)


@pytest.mark.skipif(not NAMESPACED, reason="needs a PID namespace (root or user namespaces)")
def test_a_daemon_that_leaves_the_process_group_dies_with_the_sandbox():
    token = "hd" + uuid.uuid4().hex[:10]
    body = ("libc = ctypes.CDLL(None)\nif libc.fork() == 0:\n    libc.setsid()\n"
            "    libc.prctl(15, {token!r}.encode(), 0, 0, 0)\n    time.sleep(120)\n    os._exit(0)\n"
            "time.sleep(0.3)\nraise RuntimeError('attack failed: the daemon must not outlive the sandbox')")
    failed(attack(body, token=token), "crash")
    assert no_process_named(token)


# -- memory and output ------------------------------------------------------------------------------
def test_memory_bomb_in_one_allocation():
    failed(attack("x = bytearray(50 * 1024 ** 3)\nreturn seed()"), "memory")


def test_memory_bomb_growing_slowly():
    failed(attack("x = []\nwhile True:\n    x.append(bytearray(10 ** 7))", limits=FAST.replace(wall_seconds=30, cpu_seconds=30)),
           "memory")


def test_huge_stdout_is_cut_off():
    v = attack("while True:\n    sys.stdout.write('x' * 65536)", limits=UNHURRIED)
    failed(v, "output_too_large")


def test_deep_recursion_is_a_crash_with_a_traceback():
    v = attack("def down(n):\n    return down(n + 1)\nreturn down(0)")
    failed(v, "crash")
    assert "RecursionError" in v.error


def test_unbounded_recursion_with_the_limit_lifted_ends_cleanly():
    failed(attack("sys.setrecursionlimit(10 ** 9)\ndef down(n):\n    return [down(n + 1)]\nreturn down(0)"),
           "timeout", "memory", "crash")


def test_huge_return_value_is_refused():
    failed(attack("return [[0.5, 0.5, 0.1]] * 2_000_000", limits=UNHURRIED), "output_too_large")


def test_deeply_nested_return_value_is_bad_output():
    failed(attack("x = []\nfor _ in range(100000):\n    x = [x]\nreturn x"), "bad_output")


def test_object_with_tricky_eq_and_float_is_bad_output():
    body = ("class Liar(float):\n    def __eq__(self, other):\n        return True\n"
            "    def __float__(self):\n        return 1e9\n    def __lt__(self, other):\n        return False\n"
            "return [[Liar(0.5), Liar(0.5), Liar(10.0)] for _ in range(26)]")
    failed(attack(body), "bad_output")


# -- files --------------------------------------------------------------------------------------
def test_writing_outside_the_scratch_dir_fails_and_leaves_nothing(tmp_path):
    target = Path("/tmp") / f"heldout-escape-{uuid.uuid4().hex}"
    v = attack("open({target!r}, 'w').write('x')\nreturn seed()", target=str(target))
    failed(v, "crash", "forbidden")
    assert not target.exists()


def test_overwriting_the_evaluators_source_fails():
    failed(attack("open({path!r}, 'a').write('\\n# pwned')\nreturn seed()", path=str(SCORING)), "crash", "forbidden")


def test_reading_the_shared_data_is_forbidden(data_dir):
    path = data_dir / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl"
    failed(attack("data = open({path!r}).read()\nreturn seed()", path=str(path)), "forbidden", "crash")


def test_reading_the_manifests_is_forbidden():
    failed(attack("m = open({path!r}).read()\nreturn seed()", path=str(MANIFEST)), "forbidden", "crash")


@pytest.mark.skipif(not NAMESPACED, reason="hiding below the audit hook needs a mount namespace")
def test_reading_hidden_files_through_libc_finds_nothing(data_dir):
    body = ("libc = ctypes.CDLL(None)\nfor p in ({a!r}, {b!r}):\n    if libc.open(p.encode(), 0) >= 0:\n"
            "        return seed()\nraise RuntimeError('attack failed: hidden files are not there')")
    v = attack(body, a=str(data_dir / "SOURCES.md"), b=str(MANIFEST))
    failed(v, "crash")
    assert "attack failed" in v.error


def test_importing_heldout_to_reach_its_data_fails():
    failed(attack("import heldout.data_manifests as m\nreturn seed()"), "crash", "forbidden")


# -- network ------------------------------------------------------------------------------------
@pytest.fixture()
def loopback_server():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    accepted: list = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                accepted.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join(2)
    server.close()


def test_socket_to_loopback_is_forbidden(loopback_server):
    port, accepted = loopback_server
    failed(attack("socket.create_connection(('127.0.0.1', {port}), timeout=2)\nreturn seed()", port=str(port)),
           "forbidden")
    assert accepted == []


@pytest.mark.skipif(not NAMESPACED, reason="blocking raw syscalls needs a network namespace")
def test_raw_connect_to_loopback_through_libc_reaches_nothing(loopback_server):
    port, accepted = loopback_server
    body = ("import struct\nlibc = ctypes.CDLL(None)\nfd = libc.socket(2, 1, 0)\n"
            "addr = struct.pack('<HH4s8x', 2, socket.htons({port}), bytes([127, 0, 0, 1]))\n"
            "if fd >= 0 and libc.connect(fd, addr, 16) == 0:\n    return seed()\n"
            "raise RuntimeError('attack failed: no route to the host loopback')")
    failed(attack(body, port=str(port)), "crash")
    assert accepted == []


def test_socket_to_a_public_address_is_forbidden():
    # 192.0.2.1 is TEST-NET-1 (documentation only); the hook stops the call before any syscall
    failed(attack("socket.create_connection(('192.0.2.1', 80), timeout=2)\nreturn seed()"), "forbidden")


def test_name_resolution_is_forbidden():
    failed(attack("socket.getaddrinfo('example.com', 80)\nreturn seed()"), "forbidden")


# -- the evaluator itself -----------------------------------------------------------------------
def test_killing_the_parent_is_forbidden():
    failed(attack("os.kill(os.getppid(), signal.SIGKILL)\nreturn seed()"), "forbidden")


@pytest.mark.skipif(not NAMESPACED, reason="needs PID namespace + throw-away uid")
def test_killing_the_parent_through_libc_cannot_reach_it():
    body = ("libc = ctypes.CDLL(None)\nlibc.kill({pid}, 9)\nlibc.kill(-1, 9)\n"
            "raise RuntimeError('attack failed: still here, the parent is out of reach')")
    failed(attack(body, pid=str(os.getpid())), "crash")


def test_patching_modules_in_the_child_cannot_change_the_score():
    # numpy is patched to make every check pass; the packing overlaps; scoring happens in the parent
    body = ("np.all = lambda *a, **k: True\nnp.any = lambda *a, **k: False\nnp.sqrt = lambda x: x * 1e9\n"
            "import builtins\nbuiltins.abs = lambda x: 0\nreturn np.array([[0.5, 0.5, 0.5]] * 26)")
    v = attack(body)
    failed(v, "invalid")
    assert "overlap" in v.feedback


def test_forging_the_result_channel_is_still_recomputed():
    # write a fake "success" with an absurd packing straight into the result pipe, then exit
    body = ("import json\nfor fd in map(int, os.listdir('/proc/self/fd')):\n    try:\n"
            "        os.write(fd, (json.dumps({{'call': 0, 'ok': True, 'value': {{'entry': 'circle_packing26', "
            "'value': [[0.5, 0.5, 10.0]] * 26}}}}) + '\\n' + json.dumps({{'done': True}}) + '\\n').encode())\n"
            "    except OSError:\n        pass\nos._exit(0)")
    v = attack(body)
    failed(v, "invalid", "bad_output", "crash")


def test_exiting_before_returning_is_a_crash():
    v = attack("os._exit(0)")
    failed(v, "crash")
    assert "without returning" in v.error


def test_syntax_error_is_a_crash_with_the_line():
    bench = get_benchmark(TASK)
    v = bench.run({"program.py": "def circle_packing26(:\n"}, bench.load_raw(None)[0], bench.context(FAST))
    failed(v, "crash")
    assert "SyntaxError" in v.error
