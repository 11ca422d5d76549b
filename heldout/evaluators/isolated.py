"""Isolated optimizers: run a user's optimizer in the allow-list sandbox, reaching its session
only through the view server's Unix socket.

Two ways in, one sandbox, one launch:

* :func:`run_isolated` runs a *command* (``heldout run --optimizer-cmd CMD``);
* :func:`run_isolated_function` runs a Python *function* ``module:function`` (``heldout run
  --optimizer module:function``, the default for user code): a small runner inside the sandbox
  imports the function, calls ``optimize(client, seed)`` with a
  :class:`~heldout.adapters.client.TaskClient` and submits what it returns as the final;
* a study cell runs its method as its study decided it (:func:`method_launch`: either of the two).

Each is prepared in one place as a :class:`Launch` (:func:`command_launch`,
:func:`function_launch`, :func:`method_launch`) and run by :func:`launch_isolated`, top-down: what
it exposes is checked, its private folder staged, the view served while the sandboxed process runs
(:mod:`heldout.evaluators.isolated_process`), and what happened read as the session's
:class:`~heldout.evaluators.session.Outcome`, which :meth:`~heldout.evaluators.session.Session.finish`
ends the session with (:func:`run_isolated` and :func:`run_isolated_function` do both).

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
Exit status 0 with a final -> an outcome with that final; anything else -> a ``failed`` one
whose error says what happened (exit status, *the signal that killed it*, the wall limit, no
final), with the tail of its output (:func:`~heldout.evaluators.isolated_process.exit_error`).
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from heldout.contracts import HeldoutError
from heldout.files import make_temp_dir, read_user_bytes, regular_files
from heldout.evaluators.records import RunRecord
from heldout.evaluators.session import Outcome, Session
from heldout.evaluators.isolated_process import exit_error, run_sandboxed
from heldout.evaluators.view_server import ViewServer
from heldout.optimizers import UserModule, find_module_source, is_heldout_code, user_code
from heldout.optimizers.resolved import ResolvedMethod
from heldout.sandbox import require_sandbox
from heldout.sandbox.cgroups import RunGroup
from heldout.sandbox.root import CODE_DIR, SANDBOX_DIR, SCRATCH_DIR, AllowList, bwrap_argv

LOG_FILE = "optimizer.log"
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


@dataclass(frozen=True)
class Launch:
    """What one isolated run starts, prepared in one place (:func:`command_launch`,
    :func:`function_launch`) before the sandbox exists: the argv inside it, the host paths
    readable inside (``(host, inside)``, read-only), the user's code copied in (name -> its file
    or top-level package folder) and what the ``optimizer_launch`` event says of it."""

    argv: list[str]
    readonly: tuple[tuple[str, str], ...] = ()
    copies: Mapping[str, Path] = field(default_factory=dict)
    what: Mapping[str, Any] = field(default_factory=dict)


def command_launch(command: str | Sequence[str]) -> Launch:
    """An optimizer command: its argv, and its existing file or directory arguments (and nothing
    around them) readable inside at their own paths."""
    argv = _resolve_argv(command)
    return Launch(argv, tuple((p, p) for p in command_files(argv)), {}, {"command": argv})


def function_launch(target: str, options: Mapping[str, Any], modules: Sequence[UserModule]) -> Launch:
    """An optimizer function ``module:function`` run by the runner inside, with ``options``; the
    user's ``modules`` (as found by path) are copied in and readable at ``/sandbox/user``."""
    if not is_function_spec(target):
        raise HeldoutError(f"an optimizer function is given as module:function, not {target!r}")
    user: dict[str, Path] = {}
    for found in modules:
        if user.get(found.top.name, found.top) != found.top:
            raise HeldoutError(f"two user modules named {found.top.name!r} ({user[found.top.name]}, {found.top}): "
                               "rename one")
        user[found.top.name] = found.top
    argv = [sys.executable, "-s", f"{LIB_DIR}/_heldout_optimizer_runner.py", target, json.dumps(dict(options))]
    return Launch(argv, (), user, {"function": target, **({"options": dict(options)} if options else {})})


def method_launch(method: ResolvedMethod) -> Launch:
    """A study cell's method as its study decided it (:class:`ResolvedMethod`): its command, or its
    function with the user's modules found when the study was made."""
    if method.command:
        return command_launch(method.command)
    return function_launch(str(method.target), method.options, method.modules)


def run_isolated(session: Session, command: str | Sequence[str], *,
                 limits: OptimizerLimits = OptimizerLimits(), env: Mapping[str, str] | None = None) -> RunRecord:
    """Run the optimizer ``command`` (a shell-like string or an argv list; no shell is involved)
    against ``session`` in the sandbox and return the session's run record (see the module
    docstring). The command's existing file or directory arguments (and nothing around them) are
    readable inside, read-only, at their own paths. ``env`` adds variables. Never raises for
    anything the optimizer does; raises :class:`~heldout.sandbox.NoSandbox` if no sandbox can be
    built, and :class:`HeldoutError` if an argument would expose the session's run dir."""
    return session.finish(launch_isolated(session, command_launch(command), limits, env))


def run_isolated_function(session: Session, target: str, *, search: Sequence[str] | None = None,
                          limits: OptimizerLimits = OptimizerLimits(), env: Mapping[str, str] | None = None,
                          options: Mapping[str, Any] | None = None,
                          modules: Sequence[UserModule] | None = None) -> RunRecord:
    """Run ``module:function`` (an optimizer ``f(client, seed, **options) -> candidate``) in the
    sandbox. ``modules`` are the user's modules it runs, as found by path (a plugin's where its
    distribution put it: :func:`~heldout.optimizers.user_modules`); without them the module, and
    the user code ``options`` name (``program=MODULE:FACTORY``), are looked up (not imported) in
    ``search`` (default :func:`~heldout.optimizers.search_path`). Their files, or their top-level
    package directories, are copied in as regular files (:func:`copy_user_code`) and readable
    inside at ``/sandbox/user``."""
    options = dict(options or {})
    if modules is None and is_function_spec(target):
        names = [target.partition(":")[0]] + [t.partition(":")[0] for t in user_code(target, options)]
        # found by path, never imported; heldout's optimizers are in the staged copy already
        modules = [find_module_source(m, search) for m in names if not is_heldout_code(m)]
    return session.finish(launch_isolated(session, function_launch(target, options, modules or []), limits, env))


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


def _check_exposure(run_dir: str, launch: Launch) -> None:
    """No path readable inside may hold the session's run dir (its ledger)."""
    run_dir = os.path.realpath(run_dir)
    hosts = [host for host, _ in launch.readonly] + [os.path.realpath(top) for top in launch.copies.values()]
    for host in hosts:
        if run_dir == host or run_dir.startswith(host.rstrip("/") + "/"):
            raise HeldoutError(f"refusing to expose {host} to the optimizer: it holds the session's run dir "
                               f"(ledger); keep optimizer code and run dirs apart")


def launch_isolated(session: Session, launch: Launch, limits: OptimizerLimits = OptimizerLimits(),
                    env: Mapping[str, str] | None = None) -> Outcome:
    """One isolated run, top-down: check what it exposes, stage its private folder (heldout's code
    for it, the user's code, the view socket), serve the view while the sandbox runs it, then read
    what happened as the session's :class:`Outcome` (a sandbox that could not be set up is the
    harness's failure: ``incomplete``)."""
    wall = _wall_limit(session.budget.wall_seconds, limits)
    child_env, log_path = _child_env(session.seed, dict(env or {})), Path(session.run_dir) / LOG_FILE
    _check_exposure(session.run_dir, launch)
    if require_sandbox() == "none":
        raise HeldoutError("an isolated optimizer needs the bubblewrap sandbox; without one, run it with "
                           "--trusted-optimizer (in-process, labelled 'trusted, not isolated')")
    private = make_temp_dir("opt-")
    privileged = os.geteuid() == 0
    uid = random.SystemRandom().randrange(3_000_000, 4_000_000) if privileged else None
    try:
        readonly = list(launch.readonly)
        if launch.copies:
            copy_user_code(launch.copies, private / "user")
            readonly.append((str(private / "user"), USER_DIR))
        lib, sock = private / "lib", private / "sock"
        _stage_lib(lib)
        sock.mkdir(mode=0o700)
        if uid is not None:
            os.chown(sock, uid, uid)
        allow = AllowList(code=lib, scratch_mb=limits.scratch_mb, readonly=tuple(readonly),
                          writable=((str(sock), SOCK_DIR),))
        readable = [inside for _, inside in launch.readonly] + [f"{USER_DIR}/{name}" for name in launch.copies]
        with ViewServer(session, socket_path=sock / "view.sock") as server:
            job = {"argv": launch.argv, "env": {**child_env, **_view_env(server, sock, uid)}, "uid": uid,
                   "limits": asdict(limits)}
            group = RunGroup.create(memory_mb=limits.memory_mb, max_processes=limits.max_processes)
            try:
                session.service.record_event("optimizer_launch", {
                    **launch.what, "isolation": f"bwrap+{group.level}", "trusted": False, "transport": "unix",
                    "wall_seconds": wall, "limits": asdict(limits), "readable": readable})
                # only the view server's thread writes the ledger meanwhile: a stop may interrupt this wait
                with session.service.interruptible():
                    exited = run_sandboxed(log_path, bwrap_argv(allow, privileged=privileged), job, group, wall,
                                            limits.max_log_bytes)
            finally:
                group.close()
        final, forbidden = server.final, server.forbidden_attempts
    finally:
        shutil.rmtree(private, ignore_errors=True)
    session.service.record_event("optimizer_exit", {
        "returncode": exited["returncode"], "signal": exited.get("signal"), "killed_for": exited["killed_for"],
        "seconds": exited["seconds"], "output_bytes": exited["output_bytes"], "final_submitted": final is not None,
        "forbidden_attempts": forbidden, "output_tail": exited["tail"][-1500:]})
    if exited.get("setup_error"):  # the harness's sandbox failed, not the optimizer: no record, resumable
        return Outcome(incomplete=f"the optimizer's sandbox could not be set up: {exited['setup_error']}")
    error = exit_error(exited, final is not None, wall)
    return Outcome(final if error is None else None, error)


def _wall_limit(budget_wall_seconds: float | None, limits: OptimizerLimits) -> float:
    if limits.wall_seconds is not None:
        return float(limits.wall_seconds)
    if budget_wall_seconds is not None:
        return float(budget_wall_seconds) + limits.grace_seconds
    return DEFAULT_WALL_SECONDS


def _child_env(seed: int, extra: dict[str, str]) -> dict[str, str]:
    """The optimizer's environment but the view's: a minimal one, then the caller's extras."""
    return {"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"]), "HOME": SCRATCH_DIR,
            "TMPDIR": SCRATCH_DIR, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": LIB_DIR, "HELDOUT_SEED": str(seed), **extra}


def _view_env(server: ViewServer, sock: Path, uid: int | None) -> dict[str, str]:
    """The view's variables, its socket owned by the throw-away uid and readable by it alone."""
    if uid is not None:
        os.chown(sock / "view.sock", uid, uid)
    os.chmod(sock / "view.sock", 0o600)
    view_env = {**server.child_env(), "HELDOUT_VIEW_SOCKET": f"{SOCK_DIR}/view.sock"}
    view_env.pop("HELDOUT_VIEW_URL", None)
    return view_env


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


__all__ = ["OptimizerLimits", "Launch", "command_launch", "function_launch", "launch_isolated", "run_isolated",
           "run_isolated_function", "method_launch", "is_function_spec", "LOG_FILE", "DEFAULT_WALL_SECONDS",
           "OPTIMIZER_MODULES"]
