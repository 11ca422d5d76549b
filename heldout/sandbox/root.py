"""The allow-list file system of every untrusted execution, built with bubblewrap (``bwrap``).

A sandboxed process starts in an **empty root** (a tmpfs, remounted read-only) that holds only:

* read-only: the Python interpreter's prefixes (``sys.prefix``/``base_prefix``/``exec_prefix``
  with their site-packages, but any *installed* copy of heldout in them masked by an empty
  tmpfs), the system library and binary dirs the interpreter links against (``/usr/lib``,
  ``/usr/lib64``, ``/usr/bin`` and the ``/lib``, ``/lib64``, ``/bin`` links) and
  ``/etc/ld.so.cache``;
* read-only at :data:`CODE_DIR`: the run's code dir (the candidate's files and the task's trusted
  helper files, written by the parent);
* read-write at :data:`SCRATCH_DIR`: a private tmpfs capped at ``scratch_mb`` **in total** (the
  working dir, ``HOME`` and ``TMPDIR``);
* whatever the caller adds explicitly (:class:`AllowList` ``readonly``/``writable``): the isolated
  optimizer's client code and its view socket's directory;
* a minimal ``/dev`` and a ``/proc`` of its own PID namespace.

Nothing else exists inside: no host ``/tmp``, ``/var/tmp``, ``/run``, ``/home``, run dirs,
ledgers, caches, data dirs, manifests or checkouts, so there is nothing to search for. bwrap also
gives fresh PID, network (no interfaces but a down loopback), IPC (no host SysV objects or POSIX
message queues; its own die with it), UTS and cgroup namespaces, a new session (no terminal
injection) and ``--die-with-parent``.
"""

from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path

SANDBOX_DIR = "/sandbox"
CODE_DIR = SANDBOX_DIR + "/code"
SCRATCH_DIR = SANDBOX_DIR + "/scratch"
SHM_MB = 64  # the sandbox's private /dev/shm
SYSTEM_DIRS = ("/usr/lib", "/usr/lib64", "/usr/bin", "/lib", "/lib64", "/bin")
SYSTEM_FILES = ("/etc/ld.so.cache",)
NAMESPACE_FLAGS = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")


@dataclass(frozen=True)
class AllowList:
    """What a sandboxed process's empty root holds beyond the interpreter: ``code`` (a host dir,
    read-only at :data:`CODE_DIR`), a ``scratch_mb`` tmpfs at :data:`SCRATCH_DIR`, and explicit
    ``(host path, path inside)`` pairs, read-only or writable. Nothing is visible by default."""

    code: Path
    scratch_mb: int
    readonly: tuple[tuple[str, str], ...] = ()
    writable: tuple[tuple[str, str], ...] = ()


def python_dirs() -> list[str]:
    """The interpreter's prefixes and the directory of its executable, outermost only."""
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    out = sorted(paths)
    return [p for p in out if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in out)]


# how every sandboxed interpreter starts: without the ``site`` start-up (-S) and the user's site
# dir (-s). The host's start-up hooks (.pth files, sitecustomize) stay outside the sandbox and
# cost it nothing (about 40 ms per interpreter here); the child puts :func:`python_path` on its
# sys.path instead, and the builtins site makes (exit, quit, help ...).
PYTHON_FLAGS = ("-S", "-s")


def python_path() -> list[str]:
    """The entries of this interpreter's ``sys.path`` inside its prefixes (what the sandbox can
    see: site-packages and any path a .pth file added there), in order: what ``site`` would have
    given the sandboxed interpreter."""
    return list(_python_path(tuple(sys.path)))


@functools.lru_cache(maxsize=4)
def _python_path(path: tuple[str, ...]) -> tuple[str, ...]:
    roots = [d.rstrip("/") + "/" for d in python_dirs()]
    out = []
    for entry in path:
        real = os.path.realpath(entry) if entry else ""
        if real and any((real + "/").startswith(r) for r in roots) and os.path.isdir(real) and real not in out:
            out.append(real)
    return tuple(out)


def installed_heldout_dirs() -> list[str]:
    """Copies of the heldout package inside the interpreter's site-packages (a non-editable
    install): masked, because they hold manifests and scoring rules."""
    candidates = set(site.getsitepackages()) | {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    out = []
    for sp in sorted(candidates):
        pkg = Path(sp) / "heldout"
        if pkg.is_dir():
            out.append(os.path.realpath(pkg))
    return out


def _ancestors(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def bwrap_argv(allow: AllowList, *, privileged: bool) -> list[str]:
    """The ``bwrap`` command line (without the program to run) for ``allow``."""
    bwrap = shutil.which("bwrap") or "bwrap"
    argv = [bwrap, *NAMESPACE_FLAGS, "--die-with-parent", "--new-session"]
    if not privileged:
        argv.append("--unshare-user")
    made: set[str] = set()

    def parents(path: str) -> None:
        # directories bwrap creates on the way are made traversable for the child's throw-away uid
        for anc in _ancestors(path):
            if anc not in made and not os.path.islink(anc):
                argv.extend(["--perms", "0755", "--dir", anc])
                made.add(anc)

    python = python_dirs()
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv.extend(["--symlink", os.readlink(path), path])
        elif os.path.isdir(path) and not any(path.startswith(p.rstrip("/") + "/") or path == p for p in python):
            parents(path)
            argv.extend(["--ro-bind", path, path])
    for path in SYSTEM_FILES:
        if os.path.exists(path):
            parents(path)
            argv.extend(["--ro-bind", path, path])
    for path in python:
        parents(path)
        argv.extend(["--ro-bind", path, path])
    for path in installed_heldout_dirs():
        argv.extend(["--perms", "0555", "--tmpfs", path])
    argv.extend(["--proc", "/proc", "--dev", "/dev"])
    # a private, size-capped /dev/shm: POSIX semaphores live there, so multiprocessing pools
    # (e.g. OpenEvolve's, in an isolated optimizer) work; nothing of the host's is in it
    argv.extend(["--size", str(SHM_MB * 1024 * 1024), "--perms", "01777", "--tmpfs", "/dev/shm"])
    parents(CODE_DIR)
    argv.extend(["--ro-bind", str(allow.code), CODE_DIR])
    for host, inside in allow.readonly:
        parents(inside)
        argv.extend(["--ro-bind", host, inside])
    for host, inside in allow.writable:
        parents(inside)
        argv.extend(["--bind", host, inside])
    argv.extend(["--size", str(int(allow.scratch_mb) * 1024 * 1024), "--perms", "01777", "--tmpfs", SCRATCH_DIR])
    argv.extend(["--remount-ro", "/", "--chdir", SCRATCH_DIR])
    return argv


def child_env(home: str) -> dict[str, str]:
    """The whole environment of a sandboxed Python: nothing of the harness's leaks in."""
    # PWD: the child starts in ``home`` (bwrap's --chdir sets it in a fresh sandbox; naming it here
    # keeps a forked child's environment the same, and its zygote's as it is, with nothing to reset)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "PWD": home,
           "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONHASHSEED": "0"}  # reproducible set/dict orders across runs
    # one thread per numeric library: thread pools count against the process limit (and a
    # fork server must stay single-threaded to fork safely)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
                "NUMEXPR_NUM_THREADS"):
        env[var] = "1"
    env["NUMBA_CACHE_DIR"] = home + "/.numba_cache"
    return env


_probe_lock = threading.Lock()
_probe_result: tuple[str, str] | None = None


def _new_lock_after_fork() -> None:
    """A child forked while another thread held ``_probe_lock`` (an MBPP+ worker process, a
    process-pool worker) would wait on it for ever: the child gets a lock of its own."""
    global _probe_lock
    _probe_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def probe_bwrap() -> tuple[str, str]:
    """``("bwrap", "")`` if bubblewrap can build a sandbox here, else ``("none", why)``. Probed
    once per process by running the interpreter in a minimal allow-list root."""
    global _probe_result
    with _probe_lock:
        if _probe_result is None:
            _probe_result = _probe()
        return _probe_result


def bwrap_probed() -> bool:
    """Whether :func:`probe_bwrap` has its answer already (it then returns at once)."""
    return _probe_result is not None


def _probe() -> tuple[str, str]:
    if not sys.platform.startswith("linux"):
        return "none", "bubblewrap sandboxes need Linux"
    if shutil.which("bwrap") is None:
        return "none", "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    empty = Path(os.path.realpath(os.devnull)).parent  # any existing dir works as the code dir
    argv = bwrap_argv(AllowList(code=empty, scratch_mb=1), privileged=os.geteuid() == 0)
    try:
        done = subprocess.run([*argv, "--", sys.executable, *PYTHON_FLAGS, "-c", "pass"], capture_output=True,
                              timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "none", f"bwrap could not start: {exc}"
    if done.returncode != 0:
        return "none", f"bwrap refused to build a sandbox: {done.stderr.decode(errors='replace').strip()[:300]}"
    return "bwrap", ""


__all__ = ["child_env", "AllowList", "CODE_DIR", "SCRATCH_DIR", "SANDBOX_DIR", "bwrap_argv", "probe_bwrap", "bwrap_probed",
           "python_dirs", "python_path", "installed_heldout_dirs", "PYTHON_FLAGS"]
