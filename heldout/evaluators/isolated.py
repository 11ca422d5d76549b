"""Isolated optimizers: run an optimizer *command* against a session it can reach only over HTTP.

:func:`run_isolated` serves the session's view (:class:`~heldout.evaluators.view_server.ViewServer`)
on a Unix socket in a private run-scoped directory and launches the command in a child that sees
the task only through that socket:

* its own process group, a scrubbed environment (the view's socket/url and token, ``PATH``,
  ``HOME`` = ``TMPDIR`` = a private scratch dir that is also its working dir, ``PYTHONPATH``
  holding a private copy of :mod:`heldout.adapters.client` and nothing else of heldout,
  ``HELDOUT_SEED``);
* with the sandbox's isolation (:func:`heldout.sandbox.isolation_mode`):

  - ``root`` (running as root, e.g. CI): fresh mount, network and PID namespaces. Empty tmpfs
    cover heldout's package directory (scoring rules, ``data_manifests``), the shared data dir
    next to a checkout, ``$HELDOUT_DATA_DIR`` and the session's data dir, the datasets/HF caches,
    the worker's response cache and the session's run dir (ledger); the temp dir is a fresh
    tmpfs holding only the child's private dir and its own code (other sessions' sockets and run
    dirs there are out of sight); every other mount is read-only except the scratch dir; the network namespace has no usable interface (the Unix
    socket is the only way out); then the child becomes a throw-away uid with no capabilities
    and ``no_new_privs``, and the socket and scratch dir belong to that uid alone.
  - ``userns``: the same namespaces inside a user namespace; capabilities are dropped and locked
    (securebits), so the child cannot unmount what hides the data. The uid is the caller's.
  - ``none`` (no usable ``unshare``, or forced with ``HELDOUT_SANDBOX_ISOLATION=none``): only the
    process group, scrubbed environment, scratch dir and rlimits. The hidden paths are never
    passed to the child, but a child running as the same user *can* read them: use ``none``
    only for optimizers you trust.

* a wall-clock limit: the budget's ``wall_seconds`` (counted from the session's start; the server
  refuses evaluations after it) plus ``grace_seconds`` to submit a final and exit; then the whole
  namespace is killed. Killing the harness (even with SIGKILL) kills the child too.

**Returning the final candidate**: the optimizer posts it to ``/final`` (``TaskClient.submit_final``),
as often as it likes; the last one counts. When the child exits with status 0 having submitted a
final, the harness calls ``session.finish(final)`` (test scored once, outside the budget). A
child that crashed, was killed at the time limit or submitted nothing gives
``finish(None, status="failed", error=...)`` with the tail of its output. The child's combined
stdout/stderr is kept (capped) in ``RUN_DIR/optimizer.log``.
"""

from __future__ import annotations

import json
import os
import random
import resource
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
from heldout.evaluators.records import RunRecord
from heldout.sandbox.process import _UNSHARE_ARGS, HIDE_ENV, _python_paths, isolation_mode
from heldout.evaluators.session import Session
from heldout.evaluators.view_server import ViewServer
import heldout.data_manifests as manifests
from heldout.sandbox import _child as sbx

LOG_FILE = "optimizer.log"
TAIL_BYTES = 4000
CLIENT_SOURCE = Path(__file__).resolve().parents[1] / "adapters" / "client.py"
CONTRACTS_SOURCE = Path(__file__).resolve().parents[1] / "contracts.py"
PACKAGE_DIR = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class OptimizerLimits:
    """Resource limits of an isolated optimizer process. ``memory_mb`` None = no address-space
    cap (optimizers may legitimately be large); ``max_processes`` counts threads too and applies
    per throw-away uid (root isolation only)."""

    grace_seconds: float = 10.0
    max_processes: int = 256
    memory_mb: int | None = None
    max_file_mb: int = 1024
    max_open_files: int = 1024
    max_log_bytes: int = 8 * 1024 * 1024


def hidden_paths(session: Session, extra: Sequence[str | os.PathLike] = ()) -> list[str]:
    """Everything an isolated optimizer must not read: heldout's package dir (scoring rules,
    manifests), the shared data dir of a checkout, ``$HELDOUT_DATA_DIR``, the session's data dir,
    the datasets/HF caches, the worker's response cache/recording, the run dir (ledger),
    ``$HELDOUT_SANDBOX_HIDE`` and ``extra``."""
    found: list[Path | str | None] = [PACKAGE_DIR, Path(manifests.__file__).resolve().parent]
    repo = PACKAGE_DIR.parent
    if (repo / "pyproject.toml").exists() or (repo / ".git").exists():
        found.append(repo.parent / "shared")
    found += [os.environ.get("HELDOUT_DATA_DIR"), session.task.data_dir, session.run_dir]
    home = Path(os.environ.get("HOME") or Path.home())
    found += [os.environ.get("HF_HOME"), os.environ.get("HF_DATASETS_CACHE"), os.environ.get("XDG_CACHE_HOME"),
              home / ".cache" / "huggingface", home / ".cache"]
    for scorer in (session.scorer, session.deploy_scorer):
        worker = scorer.worker
        cache = getattr(worker, "cache", None)
        recorder = getattr(worker, "recorder", None)
        found += [getattr(cache, "directory", None), getattr(recorder, "path", None)]
    found += os.environ.get(HIDE_ENV, "").split(os.pathsep)
    found += list(extra)
    out: list[str] = []
    for path in found:
        if not path:
            continue
        resolved = str(Path(path).resolve())
        if resolved != "/" and resolved not in out:
            out.append(resolved)
    return out


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


class _LogPump(threading.Thread):
    """Copies the child's output to the run dir (up to a cap) and keeps its tail."""

    def __init__(self, stream, path: Path, cap: int) -> None:
        super().__init__(name="heldout-optimizer-log", daemon=True)
        self.stream, self.path, self.cap = stream, path, cap
        self.tail = bytearray()
        self.total = 0

    def run(self) -> None:
        with open(self.path, "ab") as out:
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


def run_isolated(session: Session, command: str | Sequence[str], *, isolation: str | None = None,
                 hide_paths: Sequence[str | os.PathLike] = (), expose_paths: Sequence[str | os.PathLike] = (),
                 limits: OptimizerLimits = OptimizerLimits(), tcp: bool = False,
                 env: Mapping[str, str] | None = None, keep_scratch: bool = False) -> RunRecord:
    """Run the optimizer ``command`` (a shell-like string or an argv list; no shell is involved)
    against ``session`` in an isolated child and return the session's run record (see the module
    docstring). ``hide_paths`` adds paths to hide (e.g. the root of a whole study's run dirs),
    ``expose_paths`` paths the child must be able to read (its own code, when it lives where a
    throw-away uid cannot look). ``tcp`` also serves the view on 127.0.0.1 (reachable only
    without a network namespace, i.e. isolation ``none``). ``env`` adds variables for the
    optimizer. Never raises for anything the optimizer does."""
    mode = isolation or isolation_mode()
    if mode not in ("root", "userns", "none"):
        raise HeldoutError(f"isolation must be root, userns or none, not {mode!r}")
    argv = _resolve_argv(command)
    hidden = hidden_paths(session, hide_paths)
    uid = random.SystemRandom().randrange(3_000_000, 4_000_000) if mode == "root" else os.getuid()
    private = Path(tempfile.mkdtemp(prefix="heldout-opt-")).resolve()
    try:
        return _run(session, argv, mode, uid, private, hidden, expose_paths, limits, tcp, env or {})
    finally:
        if not keep_scratch:
            shutil.rmtree(private, ignore_errors=True)


def _private_layout(private: Path, uid: int, mode: str) -> tuple[Path, Path, Path]:
    """``private/`` (traverse-only) holding ``scratch/`` and ``sock/`` (the child's uid alone) and
    ``lib/`` (the client, read-only for everyone)."""
    scratch, sock, lib = private / "scratch", private / "sock", private / "lib"
    for d in (scratch, sock, lib / "heldout" / "adapters"):
        d.mkdir(parents=True, mode=0o700)
    pkg = lib / "heldout"
    (pkg / "__init__.py").write_text('"""heldout, as an isolated optimizer sees it: the client only."""\n')
    (pkg / "adapters" / "__init__.py").write_text("")
    shutil.copyfile(CLIENT_SOURCE, pkg / "adapters" / "client.py")
    shutil.copyfile(CONTRACTS_SOURCE, pkg / "contracts.py")
    for path in (lib, pkg, pkg / "adapters"):
        path.chmod(0o755)
    for path in pkg.rglob("*.py"):
        path.chmod(0o644)
    private.chmod(0o711)
    if mode == "root":
        for d in (scratch, sock):
            os.chown(d, uid, uid)
    return scratch, sock, lib


def _run(session: Session, argv: list[str], mode: str, uid: int, private: Path, hidden: list[str],
         expose_paths: Sequence[str | os.PathLike], limits: OptimizerLimits, tcp: bool,
         extra_env: Mapping[str, str]) -> RunRecord:
    scratch, sock, lib = _private_layout(private, uid, mode)
    socket_path = sock / "view.sock"
    server = ViewServer(session, socket_path=socket_path, host="127.0.0.1" if tcp else None)
    server.start()
    try:
        if mode == "root":
            os.chown(socket_path, uid, uid)
        os.chmod(socket_path, 0o600)
        child_env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
                     "HOME": str(scratch), "TMPDIR": str(scratch), "PYTHONPATH": str(lib),
                     "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                     "HELDOUT_SEED": str(session.seed), **dict(extra_env), **server.child_env()}
        expose = _python_paths() + [str(lib)] + [str(Path(p).resolve()) for p in expose_paths]
        # the command's own files: their directories must be readable by the child's uid
        expose += [a if os.path.isdir(a) else os.path.dirname(a) for a in argv
                   if os.path.isabs(a) and os.path.exists(a)]
        job = {"isolation": mode, "uid": uid, "scratch": str(scratch), "hide": hidden,
               "expose": sorted(set(expose)), "tmp": str(Path(tempfile.gettempdir()).resolve()),
               "private": str(private), "argv": argv, "env": child_env,
               "limits": {"cpu_seconds": 10 ** 9, "memory_mb": limits.memory_mb or 0,
                          "max_processes": limits.max_processes, "max_file_mb": limits.max_file_mb,
                          "max_open_files": limits.max_open_files}}
        session.service.record_event("optimizer_launch", {
            "command": argv, "isolation": mode, "hidden": hidden, "transport": "unix" + ("+tcp" if tcp else ""),
            "limits": asdict(limits)})
        outcome = _execute(session, job, private, limits)
    finally:
        server.close()
    return _finish(session, server, outcome)


def _execute(session: Session, job: dict[str, Any], private: Path, limits: OptimizerLimits) -> dict[str, Any]:
    job_path = private / "job.json"
    fd = os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(job, fh)
    launcher = [sys.executable, "-I", "-c",
                "import sys; sys.path.insert(0, sys.argv[2]); "
                "from heldout.evaluators.isolated import _launch; _launch(sys.argv[1])",
                str(job_path), str(PACKAGE_DIR.parent)]
    cmd = launcher
    mode = job["isolation"]
    if mode != "none":
        cmd = [shutil.which("unshare") or "unshare", *_UNSHARE_ARGS[mode], "--", *cmd]
    setpriv = shutil.which("setpriv")
    if setpriv:  # the child dies with the harness, even on SIGKILL
        cmd = [setpriv, "--pdeathsig", "KILL", "--", *cmd]
    budget = session.budget
    deadline = None
    if budget.wall_seconds is not None:
        deadline = session._started + budget.wall_seconds + limits.grace_seconds
    started = time.time()
    log_path = Path(session.run_dir) / LOG_FILE
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=job["scratch"],
                                env={"PATH": job["env"]["PATH"], "LANG": "C.UTF-8"})
    except OSError as exc:
        return {"returncode": None, "killed_for": None, "seconds": 0.0,
                "tail": f"could not start the optimizer: {exc}", "output_bytes": 0}
    pump = _LogPump(proc.stdout, log_path, limits.max_log_bytes)
    pump.start()
    killed_for = None
    try:
        while True:
            timeout = None if deadline is None else max(0.0, deadline - time.time())
            try:
                proc.wait(timeout=timeout)
                break
            except subprocess.TimeoutExpired:
                killed_for = "wall_time"
                _kill_group(proc)
    except BaseException:
        _kill_group(proc)  # the harness is being interrupted: never leave the child behind
        proc.wait()
        raise
    finally:
        _kill_group(proc)  # stragglers of a child in mode "none" that left running processes
    pump.join(timeout=10)
    proc.stdout.close()
    return {"returncode": proc.returncode, "killed_for": killed_for, "seconds": round(time.time() - started, 3),
            "tail": pump.text(), "output_bytes": pump.total}


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _finish(session: Session, server: ViewServer, outcome: dict[str, Any]) -> RunRecord:
    final = server.final
    session.service.record_event("optimizer_exit", {
        "returncode": outcome["returncode"], "killed_for": outcome["killed_for"], "seconds": outcome["seconds"],
        "output_bytes": outcome["output_bytes"], "final_submitted": final is not None,
        "forbidden_attempts": server.forbidden_attempts, "output_tail": outcome["tail"][-1500:]})
    tail = outcome["tail"].strip()
    tail_note = f"\n--- last output ---\n{tail[-1500:]}" if tail else ""
    if outcome["killed_for"] == "wall_time":
        error = (f"optimizer killed at the wall-time limit ({session.budget.wall_seconds} s budget + grace)"
                 + tail_note)
    elif outcome["returncode"] is None:
        error = outcome["tail"]
    elif outcome["returncode"] != 0:
        how = (f"killed by signal {signal.Signals(-outcome['returncode']).name}" if outcome["returncode"] < 0
               else f"exited with status {outcome['returncode']}")
        error = f"optimizer {how}" + tail_note
    elif final is None:
        error = "optimizer exited without submitting a final candidate (POST /final)" + tail_note
    else:
        return session.finish(final)
    return session.finish(None, status="failed", error=error)


# -- the child side ------------------------------------------------------------------------------
PR_SET_SECUREBITS = 28
# NOROOT + NO_SETUID_FIXUP + KEEP_CAPS... each with its lock bit: uid 0 in a user namespace
# gets no capabilities back on execve, so it cannot unmount what hides the data
SECUREBITS_LOCKED_NOROOT = 0b1111
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


def _private_tmp(sbx, job: dict[str, Any]) -> None:
    """Give the child a fresh, empty temp dir holding only what it needs from the real one (its
    private dir, its own code): other sessions' sockets and run dirs there stay out of sight even
    for a child with the harness's uid (userns mode). What the child needs from there (Python
    itself, when a virtualenv lives in the temp dir) is in ``expose`` and bound back in."""
    tmp = job["tmp"]
    if tmp == "/":
        return
    keep = sorted({p for p in [job["private"], *job["expose"]] if sbx.inside(p, tmp) and os.path.exists(p)})
    fds = {p: os.open(p, os.O_PATH) for p in keep}
    sbx.mount("tmpfs", tmp, "tmpfs", sbx.MS_NOSUID | sbx.MS_NODEV, "mode=1777,size=1m")
    for path, fd in fds.items():
        os.makedirs(path, mode=0o755, exist_ok=True)
        sbx.mount(f"/proc/self/fd/{fd}", path, None, sbx.MS_BIND | sbx.MS_REC)
        os.close(fd)


def _launch(job_path: str) -> None:
    """Runs as the first process in the child's namespaces (see :func:`_execute`): isolate with
    the sandbox's own helpers, then replace itself with the optimizer command."""

    try:
        with open(job_path, encoding="utf-8") as fh:
            job = json.load(fh)
        os.unlink(job_path)
        mode = job["isolation"]
        if mode == "userns":
            if sbx.libc().prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED_NOROOT, 0, 0, 0) != 0:
                raise OSError("cannot lock securebits in the user namespace")
            sbx.libc().prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        limits = dict(job["limits"])
        if not limits["memory_mb"]:  # no address-space cap: keep the current hard limit
            hard = resource.getrlimit(resource.RLIMIT_AS)[1]
            limits["memory_mb"] = 1 << 40 if hard == resource.RLIM_INFINITY else hard // (1 << 20)
        if mode != "none":
            _private_tmp(sbx, job)
        sbx.isolate({**job, "limits": limits})
        sbx.libc().prctl(sbx.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with our parent
    except Exception as exc:  # noqa: BLE001
        print(f"heldout: isolating the optimizer failed: {exc!r}", file=sys.stderr, flush=True)
        os._exit(125)
    argv = job["argv"]
    try:
        os.execvpe(argv[0], argv, job["env"])
    except OSError as exc:
        print(f"heldout: cannot run the optimizer command {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(127)


__all__ = ["OptimizerLimits", "hidden_paths", "run_isolated", "LOG_FILE"]
