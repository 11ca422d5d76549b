"""Isolated optimizers: run a user's optimizer in the allow-list sandbox, reaching its session
only through the view server's Unix socket.

Two ways in, one sandbox:

* :func:`run_isolated` runs a *command* (``heldout run --optimizer-cmd CMD``);
* :func:`run_isolated_function` runs a Python *function* ``module:function`` (``heldout run
  --optimizer module:function``, the default for user code): a small runner inside the sandbox
  imports the function, calls ``optimize(client, seed)`` with a
  :class:`~heldout.adapters.client.TaskClient` and submits what it returns as the final.

The sandbox (:mod:`heldout.sandbox.root`) is an empty root holding read-only the interpreter and
its packages, the optimizer's own code (the command's files' directories, or the user module's
file / top-level package dir, never a whole checkout), a code-only copy of the few heldout
modules an optimizer may import (:data:`OPTIMIZER_MODULES`: contracts, the client, the reference
optimizers; no benchmarks, manifests, data or scoring rules), the socket directory (read-write)
and a size-capped tmpfs scratch. Nothing else exists inside: not the run dir (ledger), other
sessions, data dirs, caches or checkouts. PID/network/IPC/UTS namespaces are fresh, the whole
process tree runs in a cgroup (memory, processes), and the optimizer runs as a throw-away uid
without capabilities when the harness is root. The budget counter lives in the harness process.

**Wall limit**: the budget's ``wall_seconds`` plus ``grace_seconds``, or, without one, a generous
default (:data:`DEFAULT_WALL_SECONDS`), always recorded in the ``optimizer_launch`` ledger event.

**Outcome**: the optimizer posts its final to ``/final`` as often as it likes; the last counts.
Exit status 0 with a final -> ``session.finish(final)``; anything else -> a ``failed`` record
whose error says what happened (exit status, *the signal that killed it*, the wall limit, no
final), with the tail of its output. A supervisor inside the sandbox reports the optimizer's
exact wait status, so a process that kills itself with a signal is reported as killed by it.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from heldout.contracts import HeldoutError
from heldout.files import read_user_bytes, regular_files
from heldout.evaluators.records import RunRecord
from heldout.evaluators.session import Session
from heldout.evaluators.view_server import ViewServer
from heldout.optimizers import UserModule, find_module_source, is_heldout_code, user_code
from heldout.sandbox import require_sandbox
from heldout.sandbox.cgroups import RunGroup
from heldout.sandbox.root import CODE_DIR, SANDBOX_DIR, SCRATCH_DIR, AllowList, bwrap_argv

LOG_FILE = "optimizer.log"
TAIL_BYTES = 4000
PACKAGE_DIR = Path(__file__).resolve().parents[1]
DEFAULT_WALL_SECONDS = 6 * 3600.0
LIB_DIR = CODE_DIR  # the staged heldout modules and the runner
SOCK_DIR = SANDBOX_DIR + "/sock"
USER_DIR = SANDBOX_DIR + "/user"
# what of heldout an isolated optimizer may import: code only, and none of it knows a label
OPTIMIZER_MODULES = ("contracts.py", "files.py", "adapters", "optimizers")
_MODULE_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class OptimizerLimits:
    """Resource limits of an isolated optimizer's whole process tree. ``wall_seconds`` None = the
    budget's wall time + ``grace_seconds``, or :data:`DEFAULT_WALL_SECONDS` without one;
    ``memory_mb`` and ``max_processes`` apply to all its processes together (cgroup)."""

    grace_seconds: float = 10.0
    wall_seconds: float | None = None
    max_processes: int = 256
    memory_mb: int = 8192
    scratch_mb: int = 1024
    max_file_mb: int = 1024
    max_open_files: int = 1024
    max_log_bytes: int = 8 * 1024 * 1024


def is_function_spec(target: str) -> bool:
    """True for ``module:function`` (the form :func:`run_isolated_function` takes)."""
    return bool(_MODULE_SPEC.match(target))


def _resolve_argv(command: str | Sequence[str]) -> list[str]:
    """Split CMD; arguments naming existing files relative to the caller's directory are made
    absolute, because the child starts in its scratch dir (so ``python examples/x.py`` works)."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if not argv:
        raise HeldoutError("the optimizer command is empty")
    out = []
    for i, arg in enumerate(argv):
        if (i > 0 or "/" in arg) and not os.path.isabs(arg) and os.path.exists(arg):
            arg = os.path.abspath(arg)
        out.append(arg)
    return out


def command_files(argv: Sequence[str]) -> list[str]:
    """The files and folders an optimizer command's arguments name (made readable inside at their
    own paths). An argument that is a symbolic link, or a FIFO, device or socket, is one
    :class:`HeldoutError`: a link would carry whatever it names on the host into the sandbox. (A
    folder is bound as it is: a link inside it resolves within the sandbox's own root, where the
    host's files are not.)"""
    found = []
    for arg in list(argv)[1:]:
        if not os.path.lexists(arg):
            continue
        if os.path.islink(arg):
            raise HeldoutError(f"optimizer command argument {arg} is a symbolic link: refused (name the file itself)")
        if not (os.path.isfile(arg) or os.path.isdir(arg)):
            raise HeldoutError(f"optimizer command argument {arg} is not a regular file or folder (a FIFO, device "
                               "or socket): refused")
        if os.path.isabs(arg):
            found.append(os.path.realpath(arg))
    return sorted(set(found))


def _stage_lib(lib: Path) -> None:
    """A code-only copy of :data:`OPTIMIZER_MODULES` (``*.py`` files, nothing else) under a stub
    ``heldout/__init__.py``: the isolated side of heldout is the client and the vocabulary."""
    pkg = lib / "heldout"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""heldout, as an isolated optimizer sees it: contracts, the client, '
                                     'the reference optimizers."""\n')
    for name in OPTIMIZER_MODULES:
        src = PACKAGE_DIR / name
        if src.is_file():
            shutil.copyfile(src, pkg / name)
            continue
        for path in sorted(src.rglob("*.py")):
            target = pkg / name / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    (lib / "_heldout_optimizer_runner.py").write_text(_RUNNER_SOURCE)
    for path in [lib, *lib.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


class _LogPump(threading.Thread):
    """Copies the child's output to the run dir (up to a cap, owner-only) and keeps its tail."""

    def __init__(self, stream, path: Path, cap: int) -> None:
        super().__init__(name="heldout-optimizer-log", daemon=True)
        self.stream, self.path, self.cap = stream, path, cap
        self.tail = bytearray()
        self.total = 0

    def run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as out:
            while True:
                chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
                if not chunk:
                    break
                if self.total < self.cap:
                    out.write(chunk[: self.cap - self.total])
                    out.flush()
                self.total += len(chunk)
                self.tail += chunk
                del self.tail[:-TAIL_BYTES]
            if self.total > self.cap:
                out.write(f"\n[heldout: output truncated; {self.total} bytes in all]\n".encode())

    def text(self) -> str:
        return self.tail.decode("utf-8", errors="replace")


def run_isolated(session: Session, command: str | Sequence[str], *,
                 limits: OptimizerLimits = OptimizerLimits(), env: Mapping[str, str] | None = None) -> RunRecord:
    """Run the optimizer ``command`` (a shell-like string or an argv list; no shell is involved)
    against ``session`` in the sandbox and return the session's run record (see the module
    docstring). The command's existing file or directory arguments (and nothing around them) are
    readable inside, read-only, at their own paths. ``env`` adds variables. Never raises for
    anything the optimizer does; raises :class:`~heldout.sandbox.NoSandbox` if no sandbox can be
    built, and :class:`HeldoutError` if an argument would expose the session's run dir."""
    argv = _resolve_argv(command)
    readonly = command_files(argv)
    return _launch(session, argv, [(p, p) for p in readonly], limits, dict(env or {}), {"command": argv})


def run_isolated_function(session: Session, target: str, *, search: Sequence[str] | None = None,
                          limits: OptimizerLimits = OptimizerLimits(), env: Mapping[str, str] | None = None,
                          options: Mapping[str, Any] | None = None,
                          modules: Sequence[UserModule] | None = None) -> RunRecord:
    """Run ``module:function`` (an optimizer ``f(client, seed, **options) -> candidate``) in the
    sandbox. ``modules`` are the user's modules it runs, as found by path (a plugin's where its
    distribution put it: :func:`~heldout.optimizers.user_modules`); without them the module, and
    the user code ``options`` name (``program=MODULE:FACTORY``), are looked up (not imported) in
    ``search`` (default :func:`~heldout.optimizers.user_modules.search_path`). Their files, or their top-level
    package directories, are copied in as regular files (:func:`copy_user_code`) and readable
    inside at ``/sandbox/user``."""
    if not is_function_spec(target):
        raise HeldoutError(f"an optimizer function is given as module:function, not {target!r}")
    options = dict(options or {})
    if modules is None:
        names = [target.partition(":")[0]] + [t.partition(":")[0] for t in user_code(target, options)]
        # found by path, never imported; heldout's optimizers are in the staged copy already
        modules = [find_module_source(m, search) for m in names if not is_heldout_code(m)]
    user: dict[str, Path] = {}
    for found in modules:
        if user.get(found.top.name, found.top) != found.top:
            raise HeldoutError(f"two user modules named {found.top.name!r} ({user[found.top.name]}, {found.top}): "
                               "rename one")
        user[found.top.name] = found.top
    argv = [sys.executable, "-s", f"{LIB_DIR}/_heldout_optimizer_runner.py", target, json.dumps(options)]
    what = {"function": target, **({"options": options} if options else {})}
    return _launch(session, argv, [], limits, dict(env or {}), what, copies=user)


def copy_user_code(tops: Mapping[str, Path], dest: Path, *, max_bytes: int = 256 << 20) -> None:
    """The user's code, each top (a module file or a package folder) copied into ``dest`` under its
    own name, as regular files only: a symlink or a special file anywhere is one
    :class:`HeldoutError` (:func:`~heldout.files.regular_files`; each file is opened without
    following a link, so one swapped in meanwhile is refused too). Readable by every uid."""
    dest.mkdir(mode=0o755)
    total = 0
    for name, top in tops.items():
        what = "the optimizer's code"
        if os.path.islink(top):
            raise HeldoutError(f"{what} {top} is a symbolic link: refused (only regular files are copied into the "
                               "sandbox)")
        files = regular_files(top, what) if top.is_dir() else [""]
        for rel in files:
            data = read_user_bytes(top / rel if rel else top, what, max_bytes=max_bytes, error=HeldoutError,
                                   follow_symlinks=False)
            total += len(data)
            if total > max_bytes:
                raise HeldoutError(f"{what} is over {max_bytes:,} bytes: refused")
            out = dest / name / rel if rel else dest / name
            out.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            out.write_bytes(data)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _launch(session: Session, argv: list[str], readonly: list[tuple[str, str]], limits: OptimizerLimits,
            extra_env: dict[str, str], what: dict[str, Any], copies: Mapping[str, Path] | None = None) -> RunRecord:
    run_dir = os.path.realpath(session.run_dir)
    hosts = [host for host, _ in readonly] + [os.path.realpath(top) for top in (copies or {}).values()]
    for host in hosts:
        if run_dir == host or run_dir.startswith(host.rstrip("/") + "/"):
            raise HeldoutError(f"refusing to expose {host} to the optimizer: it holds the session's run dir "
                               f"(ledger); keep optimizer code and run dirs apart")
    level = require_sandbox()
    if level == "none":
        raise HeldoutError("an isolated optimizer needs the bubblewrap sandbox; without one, run it with "
                           "--trusted-optimizer (in-process, labelled 'trusted, not isolated')")
    private = Path(tempfile.mkdtemp(prefix="heldout-opt-")).resolve()
    try:
        if copies:
            copy_user_code(copies, private / "user")
            readonly = [*readonly, (str(private / "user"), USER_DIR)]
            what = {**what, "copied": [f"{USER_DIR}/{name}" for name in copies]}
        return _run(session, argv, readonly, limits, extra_env, what, private)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _wall_limit(session: Session, limits: OptimizerLimits) -> float:
    if limits.wall_seconds is not None:
        return float(limits.wall_seconds)
    if session.budget.wall_seconds is not None:
        return float(session.budget.wall_seconds) + limits.grace_seconds
    return DEFAULT_WALL_SECONDS


def _run(session: Session, argv: list[str], readonly: list[tuple[str, str]], limits: OptimizerLimits,
         extra_env: dict[str, str], what: dict[str, Any], private: Path) -> RunRecord:
    privileged = os.geteuid() == 0
    uid = random.SystemRandom().randrange(3_000_000, 4_000_000) if privileged else None
    lib, sock = private / "lib", private / "sock"
    _stage_lib(lib)
    sock.mkdir(mode=0o700)
    if uid is not None:
        os.chown(sock, uid, uid)
    server = ViewServer(session, socket_path=sock / "view.sock")
    server.start()
    wall = _wall_limit(session, limits)
    try:
        if uid is not None:
            os.chown(sock / "view.sock", uid, uid)
        os.chmod(sock / "view.sock", 0o600)
        view_env = {**server.child_env(), "HELDOUT_VIEW_SOCKET": f"{SOCK_DIR}/view.sock"}
        view_env.pop("HELDOUT_VIEW_URL", None)
        env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"]), "HOME": SCRATCH_DIR, "TMPDIR": SCRATCH_DIR, "LANG": "C.UTF-8",
               "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": LIB_DIR,
               "HELDOUT_SEED": str(session.seed), **extra_env, **view_env}
        allow = AllowList(code=lib, scratch_mb=limits.scratch_mb, readonly=tuple(readonly),
                          writable=((str(sock), SOCK_DIR),))
        job = {"argv": argv, "env": env, "uid": uid, "limits": asdict(limits)}
        group = RunGroup.create(memory_mb=limits.memory_mb, max_processes=limits.max_processes)
        what = dict(what)
        copied = what.pop("copied", [])  # the user's code: copied in, each readable under its own name
        session.service.record_event("optimizer_launch", {
            **what, "isolation": f"bwrap+{group.level}", "trusted": False, "transport": "unix",
            "wall_seconds": wall, "limits": asdict(limits),
            "readable": [inside for _, inside in readonly if inside != USER_DIR] + copied})
        try:
            # only the view server's thread writes the ledger meanwhile: a stop may interrupt this wait
            with session.service.interruptible():
                outcome = _execute(session, allow, job, group, wall, limits, privileged)
        finally:
            group.close()
    finally:
        server.close()
    return _finish(session, server, outcome, wall)


def _execute(session: Session, allow: AllowList, job: dict[str, Any], group: RunGroup, wall: float,
             limits: OptimizerLimits, privileged: bool) -> dict[str, Any]:
    # the supervisor's source goes on the command line and the job on stdin: nothing of the job
    # (the view token) stays readable inside but the optimizer's own environment
    status_r, status_w = os.pipe()
    cmd = [*bwrap_argv(allow, privileged=privileged), "--", sys.executable, "-s", "-c", _SUPERVISOR_SOURCE,
           str(status_w), _CHILD_HELPERS]
    cmd = group.attach_argv(cmd)
    log_path = Path(session.run_dir) / LOG_FILE
    started = time.time()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                pass_fds=(status_w,), start_new_session=True, cwd="/",
                                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    except OSError as exc:
        os.close(status_r)
        os.close(status_w)
        return {"returncode": None, "signal": None, "killed_for": None, "seconds": 0.0,
                "tail": f"could not start the optimizer: {exc}", "output_bytes": 0}
    os.close(status_w)
    try:
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
    except OSError:
        pass
    pump = _LogPump(proc.stdout, log_path, limits.max_log_bytes)
    pump.start()
    killed_for = None
    try:
        try:
            proc.wait(timeout=wall)
        except subprocess.TimeoutExpired:
            killed_for = "wall_time"
    finally:
        # the harness may be interrupted too: never leave the child behind
        group.kill_run(proc.pid)
        proc.wait()
    with os.fdopen(status_r, "rb") as fh:
        status_text = fh.read(4096).decode(errors="replace")
    pump.join(timeout=10)
    proc.stdout.close()
    status = _parse_status(status_text)
    return {"returncode": status.get("exit", proc.returncode), "signal": status.get("signal"),
            "setup_error": status.get("setup_error"), "killed_for": killed_for,
            "seconds": round(time.time() - started, 3), "tail": pump.text(), "output_bytes": pump.total,
            "memory_exceeded": group.memory_exceeded(), "oom_kills": group.oom_kills(),
            "processes_exceeded": group.processes_exceeded()}


def _parse_status(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict):
            return msg
    return {}


def _finish(session: Session, server: ViewServer, outcome: dict[str, Any], wall: float) -> RunRecord:
    final = server.final
    session.service.record_event("optimizer_exit", {
        "returncode": outcome["returncode"], "signal": outcome.get("signal"), "killed_for": outcome["killed_for"],
        "seconds": outcome["seconds"], "output_bytes": outcome["output_bytes"], "final_submitted": final is not None,
        "forbidden_attempts": server.forbidden_attempts, "output_tail": outcome["tail"][-1500:]})
    tail = outcome["tail"].strip()
    tail_note = f"\n--- last output ---\n{tail[-1500:]}" if tail else ""
    sig = outcome.get("signal")
    if outcome["killed_for"] == "wall_time":
        error = f"optimizer killed at its wall-time limit ({wall:g} s)" + tail_note
    elif outcome.get("setup_error"):  # the harness's sandbox failed, not the optimizer: no record, resumable
        session.end_incomplete("optimisation", f"the optimizer's sandbox could not be set up: {outcome['setup_error']}")
    elif outcome["returncode"] is None and sig is None:
        error = outcome["tail"]
    elif sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        error = f"optimizer crashed: killed by signal {name}"
        if outcome.get("memory_exceeded"):
            error += " (whole-run memory limit reached)"
        error += tail_note
    elif outcome["returncode"] != 0:
        error = f"optimizer crashed: exited with status {outcome['returncode']}" + tail_note
    elif outcome.get("oom_kills"):
        # the memory limit is a budget of the whole tree: a run that went over it is not a run
        # within budget, even if the process the kernel picked was a helper and the main one went on
        error = (f"optimizer crashed: its processes together went over the whole-run memory limit and the "
                 f"kernel killed {outcome['oom_kills']} of them" + tail_note)
    elif final is None:
        error = "optimizer exited without submitting a final candidate (POST /final)" + tail_note
    else:
        return session.finish(final)
    return session.finish(None, status="failed", error=error)


# -- inside the sandbox --------------------------------------------------------------------------------
# The supervisor is the sandbox's first Python: it reads the job from stdin, forks the optimizer
# (rlimits, throw-away uid, no new privileges, exec), waits for it and writes its exact wait status
# to a pipe the optimizer does not hold. As root-in-the-sandbox it cannot be signalled by the
# optimizer's uid.
_CHILD_HELPERS = (PACKAGE_DIR / "sandbox" / "_child.py").read_text(encoding="utf-8")  # for its seccomp filter
_SUPERVISOR_SOURCE = r'''
import ctypes, json, os, resource, sys
status = int(sys.argv[1])
helpers = {"__name__": "heldout_sandbox_child"}
exec(sys.argv[2], helpers)
job = json.loads(sys.stdin.buffer.read())
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
def report(**msg):
    os.write(status, (json.dumps(msg) + "\n").encode())
pid = os.fork()
if pid == 0:
    try:
        os.close(status)
        os.chdir("/sandbox/scratch")
        lim = job["limits"]
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim["max_file_mb"] << 20,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim["max_open_files"],) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        uid = job["uid"]
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            resource.setrlimit(resource.RLIMIT_NPROC, (lim["max_processes"],) * 2)
        ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        helpers["install_seccomp"]()  # no new namespaces, mounts, ptrace, bpf ... (see heldout.sandbox._child)
    except Exception as exc:
        print(f"heldout: isolating the optimizer failed: {exc!r}", file=sys.stderr, flush=True)
        os._exit(125)
    argv = job["argv"]
    try:
        os.execve(argv[0], argv, job["env"]) if "/" in argv[0] else os.execvpe(argv[0], argv, job["env"])
    except OSError as exc:
        print(f"heldout: cannot run the optimizer command {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(127)
_, wait_status = os.waitpid(pid, 0)
if os.WIFSIGNALED(wait_status):
    report(signal=os.WTERMSIG(wait_status))
else:
    report(exit=os.WEXITSTATUS(wait_status))
'''

# Runs ``module:function`` with a TaskClient (``heldout run --optimizer module:function``).
_RUNNER_SOURCE = '''"""heldout's runner for an isolated optimizer function: optimize(client, seed) -> final."""
import importlib
import json
import os
import sys

sys.path[:0] = ["/sandbox/user", "/sandbox/lib"]
from heldout.adapters.client import TaskClient

module, _, name = sys.argv[1].partition(":")
options = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
optimize = getattr(importlib.import_module(module), name)
client = TaskClient.from_env()
final = optimize(client, int(os.environ["HELDOUT_SEED"]), **options)
if final is not None:
    client.submit_final(final)
'''


__all__ = ["OptimizerLimits", "run_isolated", "run_isolated_function", "is_function_spec", "LOG_FILE",
           "DEFAULT_WALL_SECONDS", "OPTIMIZER_MODULES"]
