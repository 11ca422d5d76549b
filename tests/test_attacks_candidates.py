"""Attack suite, candidates: hostile programs run as real candidates of ``circle_packing/square26``.

Each case is a real attempt. Convention: the program returns the valid seed packing **only if the
attack worked**, and raises otherwise; so every case must end with score 0, ``valid=False`` and a
clear, named error (the attack failed), and the host must be unharmed. Families: labels through
the file system, sockets (TCP, Unix files, abstract), SysV IPC, processes and memory, disk, the
kernel's own escape hatches, and forged result-channel lines.
"""

from __future__ import annotations

import ctypes
import os
import socket
import tempfile
import uuid
from pathlib import Path

import pytest

from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import RunLimits
from heldout.evaluators.ledger import ledger_key_path
from heldout.sandbox import isolation_mode, zygote

pytestmark = pytest.mark.skipif(isolation_mode() != "bwrap", reason="the allow-list sandbox needs bubblewrap")

TASK = "circle_packing/square26"
LIMITS = RunLimits(wall_seconds=20, cpu_seconds=20, memory_mb=400, max_processes=32, max_file_mb=16)
REPO = Path(__file__).resolve().parents[1]
HEADER = '''\
import ctypes, errno, os, socket, struct, sys
import numpy as np

libc = ctypes.CDLL(None, use_errno=True)


def seed():
    rows = [[0.1 + 0.2 * i, 0.1 + 0.2 * j, 0.0999] for i in range(5) for j in range(5)]
    return np.array(rows + [[0.0, 0.0, 0.0]])


def blocked(why):
    raise RuntimeError("attack blocked: " + str(why))


def walk_for(names, suffixes=()):
    found = []
    for top in ("/", "/proc/1/root", "/proc/self/root"):
        for d, dirs, files in os.walk(top, onerror=lambda e: None):
            if d.startswith(("/proc", "/sys")) and top == "/":
                dirs[:] = []
                continue
            found += [os.path.join(d, f) for f in files
                      if f in names or os.path.join(d, f).endswith(tuple(suffixes))]
            if len(found) > 20:
                return found
    return found


def circle_packing26():
'''


def fill(template: str, **values) -> str:
    """``{name}`` and ``{name!r}`` placeholders (plain replace: the bodies hold set literals)."""
    for name, value in values.items():
        template = template.replace(f"{{{name}!r}}", repr(value)).replace(f"{{{name}}}", str(value))
    return template


def attack(body: str, limits: RunLimits = LIMITS):
    text = HEADER + "".join(f"    {line}\n" for line in body.splitlines())
    bench = get_benchmark(TASK)
    return bench.run({"program.py": text}, bench.load_raw(None)[0], bench.context(limits))


def assert_blocked(verdict, kinds=("crash",)):
    assert verdict.score == 0.0 and not verdict.valid, verdict
    assert verdict.error and verdict.error_kind in kinds, (verdict.error_kind, verdict.error)
    assert verdict.error_kind != "sandbox_error"  # the candidate's failure, never the harness's


@pytest.fixture(autouse=True)
def through_the_fork_server(request):
    """Every attack here runs in a child of the fork server (the default) when it is available."""
    before = zygote.stats()["executions"]
    yield
    if zygote.fork_server_enabled() and "bait_is_real" not in request.node.name:
        assert zygote.stats()["executions"] > before, "the attack did not run through the fork server"


# -- host bait: real label files, sockets and IPC objects the attacks look for ------------------------
@pytest.fixture(scope="module")
def bait():
    """A world-readable folder with a ledger, a run record, a manifest and data files holding a
    marker, like another session's run dir next to a copy of the data."""
    root = Path(tempfile.mkdtemp(prefix="heldout-bait-"))
    root.chmod(0o755)
    marker = uuid.uuid4().hex
    for rel in ("run/ledger.jsonl", "run/run_record.json", "run/ledger.head", "manifests/square26.json",
                "data/mbpp_plus/MbppPlus.jsonl", "data/SOURCES.md", "shared/specs/lockpicking.md"):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o755)
        path.write_text(f'{{"target": "{marker}"}}\n')
        path.chmod(0o644)
    yield root, marker
    for path in sorted(root.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    root.rmdir()


FS_CASES = {
    "walk_for_ledgers": "f = walk_for({'ledger.jsonl', 'ledger.head'})\nreturn seed() if f else blocked(f)",
    "walk_for_run_records": "f = walk_for({'run_record.json', 'study.json'})\nreturn seed() if f else blocked(f)",
    "walk_for_manifests": "f = walk_for({'square26.json', 'word_sorting.json', 'takehome.json'})\n"
                          "return seed() if f else blocked(f)",
    "walk_for_data_files": "f = walk_for({'SOURCES.md', 'lockpicking.md', 'MbppPlus.jsonl', 'MbppPlus-v0.2.0.jsonl'})\n"
                           "return seed() if f else blocked(f)",
    "walk_for_answer_keys": "f = walk_for({'champion.sql', 'lockpicking_champion.sql'}, ('lockpicking/rules.py',))\n"
                            "return seed() if f else blocked(f)",
    "read_bait_by_path": "open('{bait}/run/ledger.jsonl').read()\nreturn seed()",
    "list_host_tmp": "names = [n for n in os.listdir('/tmp') if n.startswith('heldout-')]\n"
                     "return seed() if names else blocked(names)",
    "read_the_checkout": "open('{repo}/heldout/data_manifests/circle_packing/square26.json').read()\nreturn seed()",
    "relative_paths_up_from_cwd": "for up in range(1, 8):\n"
                                  "    p = '../' * up + 'shared/data/SOURCES.md'\n"
                                  "    if os.path.exists(p):\n        return seed()\nblocked('no ../shared')",
    "import_heldout_package": "import heldout.data_manifests\nreturn seed()",
    "site_packages_for_manifests": "import site\n"
                                   "hits = [os.path.join(d, f) for sp in site.getsitepackages() for d, _, fs in os.walk(sp)"
                                   " for f in fs if 'data_manifests' in d and f.endswith('.json')]\n"
                                   "return seed() if hits else blocked(hits)",
    "read_the_ledger_key": "open({key!r}).read()\nreturn seed()",
    "read_harness_home": "names = os.listdir(os.path.expanduser('~root'))\n"
                         "return seed() if '.config' in names or '.cache' in names else blocked(names)",
    "read_etc_shadow": "open('/etc/shadow').read()\nreturn seed()",
    "harness_environment": "leaks = [k for k in os.environ if k.startswith(('HELDOUT', 'HF_', 'OPENAI'))]\n"
                           "return seed() if leaks else blocked(sorted(os.environ))",
    "write_the_code_dir": "open('/sandbox/code/program.py', 'a').write('#')\nreturn seed()",
    "write_system_dirs": "open('/usr/lib/heldout-planted', 'w').write('x')\nreturn seed()",
    "write_the_root": "open('/planted', 'w').write('x')\nreturn seed()",
    "symlink_out_of_scratch": "os.symlink('{bait}', 'escape')\nopen('escape/run/ledger.jsonl').read()\nreturn seed()",
    "proc_root_of_pid1": "os.listdir('/proc/1/root{bait}')\nreturn seed()",
}


@pytest.mark.parametrize("name", sorted(FS_CASES))
def test_file_system_attacks_find_nothing(name, bait):
    root, marker = bait
    body = fill(FS_CASES[name], bait=root, repo=REPO, key=str(ledger_key_path()))
    # time enough to walk everything it can see with a cold file cache (a walk cut short by the
    # wall limit would prove nothing: the test needs it to finish and report what it found)
    verdict = attack(body, LIMITS.replace(wall_seconds=120, cpu_seconds=120))
    assert_blocked(verdict, ("crash", "forbidden"))
    assert marker not in (verdict.error or "") + verdict.feedback


def test_the_bait_is_real_so_the_cases_above_can_fail(bait):
    root, marker = bait
    assert marker in (root / "run" / "ledger.jsonl").read_text()
    assert (REPO / "heldout" / "data_manifests" / "circle_packing" / "square26.json").exists()


# -- kernel escape hatches (raw libc calls, below Python's audit hook) -------------------------------
KERNEL_CASES = {
    "mount_tmpfs": "r = libc.mount(b'none', b'/sandbox/scratch', b'tmpfs', 0, None)\n"
                   "return seed() if r == 0 else blocked(os.strerror(ctypes.get_errno()))",
    "remount_root_rw": "r = libc.mount(None, b'/', None, 32 | 4096, None)\n"
                       "return seed() if r == 0 else blocked(os.strerror(ctypes.get_errno()))",
    "unshare_user_namespace": "r = libc.unshare(0x10000000)\n"
                              "return seed() if r == 0 else blocked(os.strerror(ctypes.get_errno()))",
    "setns_into_host_net": "fd = os.open('/proc/1/ns/net', os.O_RDONLY)\nr = libc.setns(fd, 0)\n"
                           "return seed() if r == 0 and os.path.exists('{bait}') else blocked(r)",
    "chroot_out": "r = libc.chroot(b'/proc/1/root')\n"
                  "return seed() if r == 0 and os.path.exists('{bait}') else blocked(os.strerror(ctypes.get_errno()))",
    "setuid_root": "r = libc.setuid(0)\nreturn seed() if r == 0 and os.getuid() == 0 else blocked(os.getuid())",
    "raise_memory_rlimit": "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))\nreturn seed()",
    "ptrace_the_harness": "r = libc.ptrace(16, {harness}, None, None)\n"
                          "return seed() if r == 0 else blocked(os.strerror(ctypes.get_errno()))",
    "signal_the_harness": "r = libc.kill({harness}, 0)\n"
                          "return seed() if r == 0 else blocked(os.strerror(ctypes.get_errno()))",
    "read_harness_environ": "open('/proc/{harness}/environ', 'rb').read()\nreturn seed()",
}


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_kernel_level_escapes_fail(name, bait):
    root, _ = bait
    verdict = attack(fill(KERNEL_CASES[name], bait=root, harness=os.getpid()))
    assert_blocked(verdict, ("crash", "forbidden"))
    assert os.getpid() > 0  # still here


# -- sockets ---------------------------------------------------------------------------------------------
@pytest.fixture
def host_listeners():
    """A TCP listener on loopback, a Unix socket file in a world-writable dir and an abstract
    Unix socket, all accepting on the host: a candidate that reaches one could talk to the host."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    folder = Path(tempfile.mkdtemp(prefix="heldout-sock-"))
    folder.chmod(0o777)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(folder / "host.sock"))
    os.chmod(folder / "host.sock", 0o777)
    unix.listen()
    name = f"heldout-test-{uuid.uuid4().hex}"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + name)
    abstract.listen()
    yield {"port": tcp.getsockname()[1], "path": str(folder / "host.sock"), "abstract": name}
    for s in (tcp, unix, abstract):
        s.close()
    (folder / "host.sock").unlink()
    folder.rmdir()


CONNECT_RAW = '''\
def raw_connect(family, addr):
    fd = libc.socket(family, 1, 0)
    if fd < 0:
        blocked("socket(): " + os.strerror(ctypes.get_errno()))
    buf = ctypes.create_string_buffer(addr)
    if libc.connect(fd, buf, len(addr)) == 0:
        return True
    blocked("connect(): " + os.strerror(ctypes.get_errno()))
'''
SOCKET_CASES = {
    "tcp_loopback_raw": CONNECT_RAW + "addr = struct.pack('=HH4s8x', 2, socket.htons({port}), bytes([127, 0, 0, 1]))\n"
                                      "return seed() if raw_connect(2, addr) else None",
    "tcp_loopback_python": "socket.create_connection(('127.0.0.1', {port}), timeout=2)\nreturn seed()",
    "unix_socket_file_raw": CONNECT_RAW + "addr = struct.pack('=H', 1) + b'{path}' + b'\\0'\n"
                                          "return seed() if raw_connect(1, addr) else None",
    "abstract_unix_socket_raw": CONNECT_RAW + "addr = struct.pack('=H', 1) + b'\\0{abstract}'\n"
                                              "return seed() if raw_connect(1, addr) else None",
    "abstract_unix_socket_python": "s = socket.socket(socket.AF_UNIX)\ns.connect('\\0{abstract}')\nreturn seed()",
    "docker_and_dbus_sockets": CONNECT_RAW + "for p in (b'/var/run/docker.sock', b'/run/dbus/system_bus_socket'):\n"
                                             "    raw_connect(1, struct.pack('=H', 1) + p + b'\\0')\nreturn seed()",
    "udp_out": "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('1.1.1.1', 53))\nreturn seed()",
    "dns_lookup": "socket.getaddrinfo('example.com', 80)\nreturn seed()",
}


@pytest.mark.parametrize("name", sorted(SOCKET_CASES))
def test_socket_attacks_reach_nothing_on_the_host(name, host_listeners):
    verdict = attack(fill(SOCKET_CASES[name], **host_listeners))
    assert_blocked(verdict, ("crash", "forbidden"))


# -- SysV IPC --------------------------------------------------------------------------------------------
IPC_CREAT, IPC_RMID = 0o1000, 0
_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture
def host_ipc():
    """A SysV shared memory segment and a message queue on the host, world-accessible."""
    key_shm, key_msg = 0x48E1D000 + os.getpid() % 4096, 0x48E1E000 + os.getpid() % 4096
    shm = _libc.shmget(key_shm, 4096, IPC_CREAT | 0o666)
    msg = _libc.msgget(key_msg, IPC_CREAT | 0o666)
    assert shm >= 0 and msg >= 0
    yield {"shm": key_shm, "msg": key_msg}
    _libc.shmctl(shm, IPC_RMID, None)
    _libc.msgctl(msg, IPC_RMID, None)


def sysv_keys() -> set[int]:
    keys = set()
    for name in ("shm", "msg", "sem"):
        lines = Path(f"/proc/sysvipc/{name}").read_text().splitlines()[1:]
        keys |= {int(line.split()[0]) for line in lines if line.split()}
    return keys


IPC_CASES = {
    "attach_host_shared_memory": "r = libc.shmget({shm}, 0, 0)\n"
                                 "return seed() if r >= 0 else blocked(os.strerror(ctypes.get_errno()))",
    "open_host_message_queue": "r = libc.msgget({msg}, 0)\n"
                               "return seed() if r >= 0 else blocked(os.strerror(ctypes.get_errno()))",
    "list_host_ipc_objects": "keys = open('/proc/sysvipc/shm').read().split()\n"
                             "return seed() if str({shm}) in keys else blocked('none visible')",
}


@pytest.mark.parametrize("name", sorted(IPC_CASES))
def test_sysv_ipc_of_the_host_is_out_of_reach(name, host_ipc):
    assert_blocked(attack(fill(IPC_CASES[name], **host_ipc)), ("crash", "forbidden"))


def test_sysv_objects_a_candidate_creates_do_not_outlive_its_run():
    key = 0x48E1F000 + os.getpid() % 4096
    body = (f"shm = libc.shmget({key}, 1 << 20, 0o1000 | 0o666)\nmsg = libc.msgget({key}, 0o1000 | 0o666)\n"
            "blocked(f'created shm {shm} msg {msg}; they must vanish with the run')")
    assert_blocked(attack(body))
    assert key not in sysv_keys()


# -- processes, memory, disk -------------------------------------------------------------------------
def test_fork_and_allocate_memory_bomb_is_stopped_by_the_whole_run_limit():
    """Each of 6 forked children (raw fork, below the audit hook) holds 150 MB: under a 400 MB
    per-process limit every child fits, only the whole-run cgroup limit stops them together."""
    body = '''\
pids = []
for _ in range(6):
    pid = libc.fork()
    if pid == 0:
        block = bytearray(150 * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        libc.pause()
        os._exit(0)
    pids.append(pid)
import time
give_up = time.time() + 15  # the bomb wins only if all six hold their memory this long
alive = pids
while len(alive) == 6 and time.time() < give_up:
    time.sleep(0.05)
    alive = [p for p in alive if os.waitpid(p, os.WNOHANG) == (0, 0)]
return seed() if len(alive) == 6 else blocked(f"{len(alive)} of 6 children survived")'''
    verdict = attack(body, LIMITS.replace(max_processes=16))
    assert_blocked(verdict, ("crash", "memory"))


def test_fork_bomb_stops_at_the_process_limit():
    body = ("n = 0\nfor _ in range(500):\n    pid = libc.fork()\n    if pid == 0:\n        libc.pause()\n"
            "        os._exit(0)\n    if pid < 0:\n        break\n    n += 1\n"
            "return seed() if n >= 500 else blocked(f'stopped after {n} forks')")
    assert_blocked(attack(body, LIMITS.replace(max_processes=20)))


def test_a_total_disk_fill_stops_at_the_scratch_quota():
    """Files of 8 MB each stay under the 16 MB per-file limit; only a total quota stops them."""
    body = ("written = 0\ntry:\n    for i in range(60):\n        with open(f'fill{i}', 'wb') as fh:\n"
            "            fh.write(b'x' * (8 << 20))\n        written += 8\nexcept OSError as exc:\n"
            "    blocked(f'{written} MB then {exc}')\nreturn seed()")
    verdict = attack(body)
    assert_blocked(verdict)
    assert "No space left" in verdict.error or "Disk quota" in verdict.error


def test_dev_shm_is_not_a_way_around_the_quota():
    body = ("try:\n    open('/dev/shm/fill', 'wb').write(b'x' * (200 << 20))\nexcept OSError as exc:\n"
            "    blocked(exc)\nreturn seed()")
    assert_blocked(attack(body), ("crash", "memory"))


# -- the result channel: forged lines never blame the harness --------------------------------------
def test_a_forged_sandbox_error_line_is_the_candidates_crash():
    body = ("for fd in range(3, 20):\n    try:\n"
            "        os.write(fd, b'{\"fatal\": true, \"error_kind\": \"sandbox_error\", \"error\": \"harness broke\"}\\n')\n"
            "    except OSError:\n        pass\nos._exit(0)")
    verdict = attack(body)
    assert_blocked(verdict)
    # whether the forged line reached the result channel before the exit depends on scheduling;
    # either way the harness is never blamed: the forged text, if it arrived, is the program's claim
    assert verdict.error_kind == "crash"
    assert "claimed a sandbox error" in verdict.error or "without returning a result" in verdict.error
    assert "harness broke" not in verdict.error or "the program claimed a sandbox error" in verdict.error


def test_a_forged_unknown_error_kind_is_a_crash():
    body = ("for fd in range(3, 20):\n    try:\n"
            "        os.write(fd, b'{\"call\": 0, \"ok\": false, \"error_kind\": \"harness_bug\", \"error\": \"not me\"}\\n')\n"
            "    except OSError:\n        pass\nblocked('forged a kind')")
    assert_blocked(attack(body))


def test_a_forged_ready_line_does_not_unlock_sandbox_error():
    body = ("for fd in range(3, 20):\n    try:\n"
            "        os.write(fd, b'{\"ready\": true}\\n{\"fatal\": true, \"error_kind\": \"sandbox_error\", \"error\": \"x\"}\\n')\n"
            "    except OSError:\n        pass\nos._exit(0)")
    verdict = attack(body)
    assert_blocked(verdict)


def test_a_forged_successful_result_is_still_scored_by_the_evaluator():
    """The program claims a perfect packing on the channel but returns nothing real: the
    verdict comes from the evaluator's own check of the claimed value, which is not a packing."""
    body = ("for fd in range(3, 20):\n    try:\n"
            "        os.write(fd, b'{\"call\": 0, \"ok\": true, \"value\": [[9, 9, 9]]}\\n{\"done\": true}\\n')\n"
            "    except OSError:\n        pass\nos._exit(0)")
    verdict = attack(body)
    assert verdict.score == 0.0 and not verdict.valid and verdict.error_kind != "sandbox_error"
