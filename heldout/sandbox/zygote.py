"""The harness side of the fork server: one long-lived zygote per preload set, started inside the
same bubblewrap sandbox as a fresh execution, forking one fully isolated child per execution
(see :mod:`heldout.sandbox._zygote` for what each child gets).

A preload set (:class:`Preload`) names installed modules and, optionally, a task's own helper
modules with their text (e.g. the ``problem`` module every VLIW kernel builder imports): the
zygote imports those from a folder of its own, out of every child's sight, so a child finds them
imported, as it finds numpy. Helpers with another text get another zygote.

What the harness trusts the zygote with is exactly what it trusts a fresh sandbox's own setup
code with: building the isolation before the candidate runs. Everything else stays in the
harness, as for a fresh sandbox: the job goes in through the child's stdin, results come back on
the child's own result pipe and stdout (both read here, size-capped), the wall clock and the CPU
limit are enforced here, and the run's processes are killed here through the execution's own
cgroup (host pids, whatever the zygote says). The zygote's exit report only feeds messages.

Each execution has its own cgroup, nested in the zygote's. The harness makes a few empty ones in
advance (:class:`~heldout.sandbox.control.GroupStock`) and hands them to the zygote, whose spares
join them before any request comes; a request goes to the spare of a group the harness took, with
that group's limits already set. Joining (a ``cgroup.procs`` write can wait ~10 ms for an RCU grace period) and making
a group are then off the execution's path. Without a prepared spare, the request brings a new
group and its child joins it, as the harness checks for every forked child.

A zygote that cannot start, dies, stops answering, or whose child could not be set up is thrown
away; :mod:`heldout.sandbox.launcher` then runs the execution in a fresh sandbox, and the next
execution starts a new zygote (after :data:`RETRY_SECONDS` if starting failed). A zygote thrown
away retires: it takes no new execution and is closed after the last one it runs (each of those
was checked in its own group; closing it at once would kill them). An execution whose zygote
dies under it, before its outcome, runs again whole in a fresh sandbox.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from heldout.files import make_temp_dir
from heldout.sandbox.cgroups import RunGroup, limits_level
from heldout.sandbox.cleanup import after_run, drain_cleanup
from heldout.sandbox.control import ControlChannel, GroupStock
from heldout.sandbox.root import CODE_DIR, PYTHON_FLAGS, SCRATCH_DIR, AllowList, bwrap_argv, child_env, python_path

FORK_SERVER_ENV = "HELDOUT_FORK_SERVER"  # "0": a fresh sandbox per execution (the opt-out)
_HERE = Path(__file__).resolve().parent
# one program: the sandboxed child, a spare execution's making, the zygote's loop (which runs it)
SOURCE = "\n".join((_HERE / name).read_text(encoding="utf-8") for name in ("_child.py", "_spare.py", "_zygote.py"))
START_SECONDS = 30.0  # to import the preload set under load
EXIT_REPORT_SECONDS = 5.0  # after its processes were killed, an execution's exit is reported at once
RETRY_SECONDS = 60.0
MAX_SERVERS = 4
# the zygote's own group holds every execution's group; each execution has its own limits
OUTER_MEMORY_MB = 1 << 20
OUTER_PROCESSES = 1 << 14


def fork_server_enabled() -> bool:
    """The default: on, unless ``$HELDOUT_FORK_SERVER=0``; and only where it gives the same
    isolation as a fresh sandbox (a root harness, cgroup v1 limits: see :func:`supported`)."""
    return os.environ.get(FORK_SERVER_ENV, "1") not in ("0", "", "false", "no") and supported()


def supported() -> bool:
    """A root harness (each child gets its own throw-away uid, as in a fresh sandbox) with cgroup
    v1 whole-run limits (each execution's group nests in the zygote's; cgroup v2's delegation
    rules for that are not implemented yet, nor per-process-only limits, where only the zygote
    could kill a child's tree)."""
    return os.geteuid() == 0 and limits_level() == "cgroup-v1"


class ForkServerDown(Exception):
    """The zygote is gone or did not answer: the execution runs in a fresh sandbox instead."""


HELPERS_DIR = "_preloaded"  # in the zygote's inbox; execution code dirs are named x...


@dataclass(frozen=True)
class Preload:
    """What a zygote imports before it forks: installed ``modules`` and the task's helper modules
    ``helpers`` as ``(file name, text)`` pairs (top-level ``.py`` files, trusted: the task's own).
    Two sets are the same zygote exactly when both parts are equal."""

    modules: tuple[str, ...]
    helpers: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(modules: Sequence[str], setup_files: dict | None = None) -> "Preload":
        """The preload set for ``modules``: those among them that are top-level ``.py`` helpers
        in ``setup_files`` (text, not a data file) are imported from that text."""
        names = set(modules)
        helpers = {name: text for name, text in (setup_files or {}).items()
                   if isinstance(name, str) and isinstance(text, str) and name.endswith(".py")
                   and "/" not in name and name[:-3] in names}
        return Preload(tuple(sorted(names)), tuple(sorted(helpers.items())))


@dataclass
class Execution:
    """One child of a zygote: the harness's ends of its pipes, and its own cgroup."""

    ident: int
    stdin: int  # write end: the job
    stdout: int  # read end: the child's stdout and stderr
    result: int  # read end: the result channel
    exit: int  # read end: the zygote's report of the execution's exit (see ForkServer.finish)
    group: RunGroup


def wait_readable(fd: int, seconds: float) -> bool:
    """True when ``fd`` has data to read, or its writer closed it, within ``seconds`` (0: now).
    poll(), not select(): the harness may hold more than 1024 descriptors, and select() refuses
    any numbered past 1023."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, seconds) * 1000))


def _spawn(preload: Preload, inbox: Path, group: RunGroup, control: socket.socket, log) -> subprocess.Popen:
    """Start a zygote for ``preload`` in a bubblewrap sandbox, in ``group``, with ``inbox`` as its
    code dir (the task's helpers in a folder of it, out of every child's sight), ``control`` its
    end of the control channel and ``log`` its stdout and stderr."""
    helpers_dir = ""
    if preload.helpers:
        (inbox / HELPERS_DIR).mkdir(mode=0o755)
        for name, text in preload.helpers:
            (inbox / HELPERS_DIR / name).write_text(text, encoding="utf-8")
        helpers_dir = f"{CODE_DIR}/{HELPERS_DIR}"
    argv = bwrap_argv(AllowList(code=inbox, scratch_mb=1), privileged=True)
    cmd = group.attach_argv([*argv, "--", sys.executable, *PYTHON_FLAGS, "-c", SOURCE, "zygote",
                             str(control.fileno()), json.dumps(list(preload.modules)), json.dumps(python_path()),
                             helpers_dir])
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(control.fileno(),),
                            start_new_session=True, env=child_env(SCRATCH_DIR), cwd="/")


class ForkServer:
    """One zygote (see the module docstring): its process, the executions it runs and when it
    stops taking them. Talking to it is :class:`~heldout.sandbox.control.ControlChannel`'s, the
    groups stocked for its spares :class:`~heldout.sandbox.control.GroupStock`'s. Thread-safe:
    executions may run concurrently."""

    def __init__(self, preload: Preload) -> None:
        self.preload = preload
        self.inbox = make_temp_dir("inbox-")
        self.group = RunGroup.create(memory_mb=OUTER_MEMORY_MB, max_processes=OUTER_PROCESSES)
        self._ids = itertools.count(1)
        self._mutex = threading.Lock()  # guards the state below
        self._down: str | None = None
        self._active: set[int] = set()  # executions started and not yet reaped
        self._retiring = False
        self._closed = False
        self._log = tempfile.TemporaryFile()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.channel = ControlChannel(ours)
        self.stock = GroupStock(self.group, self.channel, lambda: self._down is None)
        try:
            if self.group.level == "rlimit":
                raise ForkServerDown("no cgroup for the fork server")
            self.proc = _spawn(preload, self.inbox, self.group, theirs, self._log)
        except BaseException:
            theirs.close()
            self.close()
            raise
        theirs.close()
        self.preloaded = self._hello()
        threading.Thread(target=self._read_reports, name="heldout-fork-server-reports", daemon=True).start()
        self.stock.refill()

    def _hello(self) -> list[str]:
        """The zygote's first message (it is ready, with what it preloaded), or ForkServerDown."""
        sock = self.channel.sock
        sock.settimeout(START_SECONDS)
        try:
            hello = json.loads(sock.recv(1 << 16) or b"null")
        except (OSError, ValueError) as exc:
            self.close()
            raise ForkServerDown(f"the fork server did not start: {exc!r} {self.log_tail()}") from exc
        if not isinstance(hello, dict) or hello.get("ready") is not True:
            self.close()
            raise ForkServerDown(f"the fork server did not start: {hello!r} {self.log_tail()}")
        sock.settimeout(None)
        return list(hello.get("preloaded") or [])

    def _read_reports(self) -> None:
        while (message := self.channel.receive()) is not None:
            self.stock.on_report(message)
        self.mark_down("the fork server closed its control channel")

    def spares_in_groups(self) -> int:
        """How many of the zygote's spares wait, ready, in a group of their own (the rest, made
        before a group was there for them, wait in the zygote's group)."""
        return self.stock.spares_in_groups()

    def alive(self) -> bool:
        return self._down is None and self.proc.poll() is None

    def log_tail(self) -> str:
        try:
            self._log.seek(0)
            return self._log.read()[-1500:].decode("utf-8", errors="replace")
        except (OSError, ValueError):
            return ""

    # -- executions ---------------------------------------------------------------------------------
    def new_code_dir(self) -> Path:
        """A fresh code dir in the inbox (the zygote sees it at ``CODE_DIR/<name>``; each child
        sees only its own, at ``CODE_DIR``)."""
        return Path(tempfile.mkdtemp(prefix="x", dir=self.inbox))

    def start(self, code: Path, env: dict[str, str], scratch_mb: int, memory_mb: int,
              max_processes: int) -> Execution:
        """Fork one child for the code dir ``code`` (from :meth:`new_code_dir`), in a group of its
        own with these limits (:meth:`GroupStock.dispatch`). Raises :class:`ForkServerDown`
        (nothing started) if the zygote is not there to ask."""
        if not self.alive():
            raise ForkServerDown(self._down or "the fork server exited")
        ident = next(self._ids)
        with self._mutex:
            self._active.add(ident)  # before the request goes out: a retiring zygote waits for it
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        res_r, res_w = os.pipe()
        exit_r, exit_w = os.pipe()
        request = {"id": ident, "name": code.name, "code": CODE_DIR, "scratch": SCRATCH_DIR,
                   "scratch_bytes": int(scratch_mb) * 1024 * 1024, "env": env}
        passed = [stdin_r, out_w, res_w]
        try:
            group = self.stock.dispatch(request, passed, exit_w, memory_mb=memory_mb, max_processes=max_processes)
        except OSError as exc:
            group, why = None, f"the fork server did not take the request: {exc!r}"
            self.mark_down(why)
        else:
            why = "could not create the execution's cgroup"
        finally:
            for fd in (*passed, exit_w):
                os.close(fd)
        if group is None:
            for fd in (stdin_w, out_r, res_r, exit_r):
                os.close(fd)
            self._inactive(ident)
            raise ForkServerDown(why)
        global _forked
        with _lock:
            _forked += 1
        after_run(self.stock.refill)  # off the caller's path: the child waits for its job
        return Execution(ident, stdin_w, out_r, res_r, exit_r, group)

    def finish(self, execution: Execution, *, need_code: bool) -> tuple[int | None, bool]:
        """The harness's end of ``execution``: unless its exit code is needed (it ended by itself,
        and is exiting), the zygote is asked to kill the execution's reaper (PID 1's death takes
        the execution's PID namespace with it); then the exit report is waited for
        (:meth:`_wait_exit`), and a retiring zygote closes after its last execution. Returns the
        exit code (None: no report came, and the zygote is thrown away) and whether the zygote
        had no spare for the execution. The caller then empties the execution's group: every
        process of the run is in it (its reaper and memory holder, which run nothing of it, are
        not), and a process leaves the group when it has exited; the group of an execution no
        spare took is never killed (another execution's spare may be moving out of it)."""
        if not need_code:
            self._ask_kill(execution)
        code, unserved = self._wait_exit(execution)
        if code is None:
            self._ask_kill(execution)
        self._inactive(execution.ident)
        return code, unserved

    def _ask_kill(self, execution: Execution) -> None:
        try:
            self.channel.send({"kill": execution.ident})
        except OSError:
            pass

    def _wait_exit(self, execution: Execution) -> tuple[int | None, bool]:
        """The exit code the zygote reports for the execution (bwrap's convention), once every
        process of the run has exited, and whether it had no spare for it; or None when the zygote
        did not report it within :data:`EXIT_REPORT_SECONDS` (it is then thrown away). Called
        once per execution. The report comes on the execution's own pipe, read by the caller's
        thread (no other thread has to wake for it). The zygote sends it when it has reaped the
        child; it then kills the namespace's PID 1, which kills whatever else the run started."""
        deadline = time.monotonic() + EXIT_REPORT_SECONDS
        report = b""
        if execution.exit < 0:
            raise ValueError("the exit of this execution was waited for already")
        try:
            while True:
                left = deadline - time.monotonic()
                if wait_readable(execution.exit, min(left, 0.1)):
                    chunk = os.read(execution.exit, 4096)
                    report += chunk
                    if not chunk or report.endswith(b"\n"):
                        break
                # a zygote gone closes the pipe; one that stopped answering is given up here (a
                # retiring one still runs its executions)
                elif left <= 0 or (self._down is not None and self._down != "retired"):
                    break
        finally:
            os.close(execution.exit)
            execution.exit = -1
        try:
            msg = json.loads(report)
        except ValueError:
            msg = None
        code = msg.get("code") if isinstance(msg, dict) and type(msg.get("code")) is int else None
        if code is None:
            self.mark_down("the fork server did not report an execution's exit")
            return None, False
        return code, msg.get("no_spare") is True

    def _inactive(self, ident: int) -> None:
        with self._mutex:
            self._active.discard(ident)
            close = self._retiring and not self._active
            self._retiring = self._retiring and not close
        if close:
            _closing(self)

    def retire(self) -> None:
        """Take no more executions and close once those running have finished: a zygote thrown
        away because one execution went wrong must not kill the others it runs, each of which
        was checked in its own group and stays under its own limits."""
        self.mark_down("retired")
        with self._mutex:
            close = not self._active and not self._closed
            self._retiring = bool(self._active)
        if close:
            _closing(self)

    def mark_down(self, why: str) -> None:
        with self._mutex:
            self._down = self._down or why

    def close(self) -> None:
        """Kill the zygote and everything it started; remove its inbox and cgroups."""
        self.mark_down("closed")
        with self._mutex:
            self._closed = True
        self.stock.clear()
        self.channel.close()
        proc = getattr(self, "proc", None)
        if proc is None:
            self.group.kill_all()
        else:
            self.group.kill_run(proc.pid)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.group.close()
        shutil.rmtree(self.inbox, ignore_errors=True)
        try:
            self._log.close()
        except OSError:
            pass


# -- the pool: one zygote per preload set ---------------------------------------------------------------
_lock = threading.Lock()
_servers: dict[Preload, ForkServer] = {}
_starting: dict[Preload, Future[ForkServer]] = {}  # started early, not yet taken by server_for
_failed_at: dict[Preload, float] = {}
_last_failure: dict[Preload, str] = {}
_retired: set[ForkServer] = set()  # thrown away, closing once their running executions finish
_retired_lock = threading.Lock()  # its own: a server is retired while _lock is held
_forked = 0  # executions forked by every zygote of this process
# zygotes are started from one long-lived thread: bwrap's --die-with-parent follows the thread
# that started it, and a caller's worker thread may end long before the zygote should
_starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="heldout-fork-server-start")


def _key(preload: Sequence[str] | Preload) -> Preload:
    return preload if isinstance(preload, Preload) else Preload.of(preload)


def _failed_lately(key: Preload) -> bool:
    """Whether the zygote for ``key`` failed to start within :data:`RETRY_SECONDS` (hold _lock)."""
    return time.monotonic() - _failed_at.get(key, -RETRY_SECONDS) < RETRY_SECONDS


def start_early(preload: Sequence[str] | Preload) -> None:
    """Begin starting the zygote for ``preload`` (module names, or a :class:`Preload`) now, on the
    starter thread, unless one runs or is starting: a caller with other work to do first (probing
    the sandbox) then finds it started, or nearly, in :func:`server_for`. A start that fails is
    recorded there, as any other."""
    key = _key(preload)
    with _lock:
        server = _servers.get(key)
        if (server is not None and server.alive()) or key in _starting or _failed_lately(key):
            return
        _starting[key] = _starter.submit(ForkServer, key)


def server_for(preload: Sequence[str] | Preload) -> ForkServer | None:
    """The running zygote for ``preload`` (started on first use), or None when none can be had
    right now (the caller runs a fresh sandbox)."""
    key = _key(preload)
    with _lock:
        server = _servers.get(key)
        if server is not None and server.alive():
            return server
        if server is not None:
            _servers.pop(key)
            _discard(server)
        if _failed_lately(key):
            return None
        try:
            server = (_starting.pop(key, None) or _starter.submit(ForkServer, key)).result()
        except (ForkServerDown, OSError) as exc:
            _failed_at[key] = time.monotonic()
            _last_failure[key] = str(exc)
            return None
        while len(_servers) >= MAX_SERVERS:
            _discard(_servers.pop(next(iter(_servers))))
        _servers[key] = server
        return server


def _forget_after_fork() -> None:
    """In a child forked from a process that used fork servers (a process-pool worker): the
    parent's zygotes, threads and locks are the parent's. The child starts its own zygotes; it
    never talks to the parent's (their control sockets would carry two callers' executions) and
    never waits on a thread that was not copied into it."""
    global _lock, _retired_lock, _starter, _forked
    _lock = threading.Lock()
    _retired_lock = threading.Lock()
    _servers.clear()  # dropped, not closed: closing would kill the parent's zygotes
    _starting.clear()
    _retired.clear()
    _failed_at.clear()
    _last_failure.clear()
    _forked = 0
    _starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="heldout-fork-server-start")


os.register_at_fork(after_in_child=_forget_after_fork)


def discard(server: ForkServer, why: str) -> None:
    """Throw a misbehaving zygote away (the next execution starts a new one)."""
    server.mark_down(why)
    with _lock:
        for key, s in list(_servers.items()):
            if s is server:
                _servers.pop(key)
    _discard(server)


def _discard(server: ForkServer) -> None:
    with _retired_lock:
        _retired.add(server)  # closed by its last execution, or at shutdown
    server.retire()


def _closing(server: ForkServer) -> None:
    """Close ``server`` on a thread of its own (never block a caller on cleanup)."""
    with _retired_lock:
        _retired.discard(server)
    threading.Thread(target=server.close, daemon=True).start()


def shutdown() -> None:
    """Stop every zygote of this process (also run at exit)."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
        starting = list(_starting.values())
        _starting.clear()
    with _retired_lock:
        servers.extend(_retired)  # at exit nothing waits for their last executions
        _retired.clear()
    for future in starting:  # started early and never taken (e.g. the sandbox probe failed)
        try:
            servers.append(future.result())
        except (ForkServerDown, OSError):
            pass
    for server in servers:
        server.close()
    drain_cleanup(10.0)


def last_failure(preload: Sequence[str] | Preload) -> str | None:
    """Why the last zygote for ``preload`` could not start (None: it did, or was never tried)."""
    with _lock:
        return _last_failure.get(_key(preload))


def stats() -> dict[str, int]:
    """How many servers run, and how many executions zygotes of this process have forked (tests check the fork server was used)."""
    with _lock:
        return {"servers": len(_servers), "executions": _forked}


atexit.register(shutdown)

__all__ = ["last_failure", "ForkServer", "ForkServerDown", "Execution", "Preload",
           "server_for", "start_early", "discard", "shutdown", "stats",
           "fork_server_enabled", "supported", "wait_readable", "FORK_SERVER_ENV"]
