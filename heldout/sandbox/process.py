"""Sandboxed execution of untrusted code: every program evaluation in heldout goes through here.

A candidate runs in a fresh Python (``python -s``, environment built from scratch) started in its own session/process group, with:

* a wall-clock timeout enforced by the parent (the whole group is killed) and rlimits on CPU time,
  address space, processes, file size and open files;
* **isolation** (:func:`isolation_mode`), the strongest the platform allows:

  - ``root``   (running as root, e.g. CI): fresh network, mount and PID namespaces (``unshare``).
    No network at all (not even loopback); every mount is read-only except the private scratch
    dir; heldout's source tree, the shared data dir, ``$HELDOUT_DATA_DIR`` and any extra hidden
    paths are covered by empty tmpfs; then the child becomes a throw-away uid (so the process
    limit counts only this run, and nothing of the parent's is writable or signalable), with no
    capabilities and ``no_new_privs``. Killing the namespace's first process kills every process
    the candidate started, even ones that left the process group.
  - ``userns`` (not root, user namespaces allowed): the same namespaces inside a user namespace,
    capabilities dropped; the uid stays the caller's, so the process limit is per user.
  - ``none`` (fallback when ``unshare`` is unavailable or refused, or forced with
    ``HELDOUT_SANDBOX_ISOLATION=none``): process group, rlimits, scrubbed env and scratch dir
    only. Network and hidden paths are then guarded only by the audit hook below, which a
    determined candidate can bypass through ctypes; use ``root`` or ``userns`` for untrusted code.

* an audit hook in the child (all modes) that ends the run with ``error_kind="forbidden"`` on
  network calls, process creation, signalling other processes and opening hidden paths, so the
  common attempts get a clear named error instead of an obscure ``OSError``;
* a scrubbed environment and a private scratch directory as working dir (deleted afterwards).

Results come back as JSON lines through a size-capped pipe: plain data only, never pickles.
Every failure maps to a named ``error_kind``: ``timeout``, ``memory``, ``crash`` (with the
traceback tail), ``bad_output``, ``forbidden``, ``output_too_large`` (and ``sandbox_error`` when
the sandbox itself could not be set up: not the candidate's fault).
"""

from __future__ import annotations

import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from heldout.contracts import HeldoutError, RunLimits

ERROR_KINDS = ("timeout", "memory", "crash", "bad_output", "forbidden", "output_too_large", "sandbox_error")
ISOLATION_ENV = "HELDOUT_SANDBOX_ISOLATION"
HIDE_ENV = "HELDOUT_SANDBOX_HIDE"
STDOUT_TAIL_BYTES = 4096
_CHILD_SOURCE = (Path(__file__).resolve().parent / "_child.py").read_text(encoding="utf-8")
_RESERVED_PREFIX = "_heldout_"


class SandboxError(HeldoutError):
    """The caller (not the candidate) asked for something impossible, e.g. a bad file path."""


@dataclass
class SandboxResult:
    """What one sandboxed execution produced. ``ok`` is True iff every call returned and its value
    was decoded; otherwise ``error``/``error_kind`` say why (never raised)."""

    ok: bool
    value: Any
    error: str | None
    error_kind: str | None
    stdout_tail: str
    seconds: float
    limits: RunLimits
    isolation: str = "none"
    calls: list[dict[str, Any]] = field(default_factory=list)  # per-call outcomes (run_calls)

    def describe_limits(self) -> str:
        lim = self.limits
        return (f"limits: {lim.wall_seconds:g} s wall, {lim.cpu_seconds:g} s cpu, {lim.memory_mb} MB, "
                f"{lim.max_processes} procs, isolation={self.isolation}")


# -- isolation detection ---------------------------------------------------------------------------
_mode_lock = threading.Lock()
_mode_cache: str | None = None

_UNSHARE_ARGS = {
    "root": ["--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private"],
    "userns": ["--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--kill-child",
               "--mount-proc", "--propagation", "private"],
}


def isolation_mode() -> str:
    """``root``, ``userns`` or ``none`` (see the module docstring); probed once per process."""
    global _mode_cache
    forced = os.environ.get(ISOLATION_ENV)
    if forced:
        if forced not in ("root", "userns", "none"):
            raise SandboxError(f"${ISOLATION_ENV} must be root, userns or none, not {forced!r}")
        return forced
    with _mode_lock:
        if _mode_cache is None:
            _mode_cache = _probe_isolation()
        return _mode_cache


def _probe_isolation() -> str:
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return "none"
    order = ["root", "userns"] if os.geteuid() == 0 else ["userns"]
    for mode in order:
        try:
            done = subprocess.run([unshare, *_UNSHARE_ARGS[mode], "--", "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return mode
    return "none"


# -- paths hidden from candidates ------------------------------------------------------------------
def default_hidden_paths() -> list[str]:
    """heldout's source tree (or its installed package dir), the shared data dir next to the repo,
    ``$HELDOUT_DATA_DIR`` and the entries of ``$HELDOUT_SANDBOX_HIDE``."""
    pkg = Path(__file__).resolve().parents[1]
    repo = pkg.parent
    prefixes = [Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]
    is_repo = (repo / "pyproject.toml").exists() or (repo / ".git").exists()
    holds_python = any(p == repo or repo in p.parents for p in prefixes)
    hidden = [repo if is_repo and not holds_python else pkg]
    if is_repo:
        hidden.append(repo.parent / "shared")
    for env in (os.environ.get("HELDOUT_DATA_DIR"), *os.environ.get(HIDE_ENV, "").split(os.pathsep)):
        if env:
            hidden.append(Path(env))
    out: list[str] = []
    for h in hidden:
        resolved = str(Path(h).resolve())
        if resolved not in out and resolved != "/":
            out.append(resolved)
    return out


def _python_paths() -> list[str]:
    """What the child must be able to read to run Python with this environment's packages."""
    paths = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths.add(str(Path(sys.executable).resolve().parent))
    out = sorted(paths)
    # drop paths inside other listed paths (one bind mount covers them)
    return [p for p in out if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in out)]


# -- the API ---------------------------------------------------------------------------------------
def run_function(files: dict[str, str], module: str, function: str, args: list | tuple = (),
                 kwargs: dict | None = None, *, limits: RunLimits, setup_files: dict[str, str] | None = None,
                 encoding: str = "json", hide_paths: Sequence[str] = (), allow_processes: bool = False,
                 ) -> SandboxResult:
    """Write ``files`` (candidate sources; relative paths) plus ``setup_files`` (trusted helper
    modules the task provides) into a fresh private scratch dir, start a fresh isolated Python,
    import ``module`` and call ``function(*args, **kwargs)``. Args/kwargs cross as JSON. The return
    value is converted to plain JSON data in the child (numpy arrays -> nested lists, tuples ->
    lists, numpy scalars -> float/int; anything else -> ``bad_output``); with
    ``encoding="typed"`` tuples, sets, bytes, complex and non-str dict keys survive as such.
    Never raises for anything the candidate does."""
    result = run_calls(files, module, function, [(list(args), dict(kwargs or {}))], limits=limits,
                       setup_files=setup_files, encoding=encoding, hide_paths=hide_paths,
                       allow_processes=allow_processes)
    if result.ok:
        result.value = result.calls[0]["value"]
    return result


def run_calls(files: dict[str, str], module: str, function: str,
              calls: Sequence[tuple[Sequence[Any], dict[str, Any]]], *, limits: RunLimits,
              per_call_seconds: Sequence[float | None] | None = None,
              setup_files: dict[str, str] | None = None, encoding: str = "json",
              hide_paths: Sequence[str] = (), stop_on_error: bool = False,
              allow_processes: bool = False, groups: Sequence[str] | None = None) -> SandboxResult:
    """Like :func:`run_function`, but call ``function`` once per ``(args, kwargs)`` in ``calls`` in
    one sandboxed process (imports are paid once). ``per_call_seconds`` adds a wall limit per call
    (enforced in the child by a timer; the overall ``limits.wall_seconds`` is still enforced by the
    parent). ``result.calls`` holds one outcome per call that ran: ``{"ok", "value"}`` or
    ``{"ok": False, "error_kind", "error"}``; ``result.value`` is the list of values when all
    succeeded. With ``stop_on_error`` the child stops at the first failing call, or, when
    ``groups`` names a group per call, skips only the rest of the failing call's group."""
    if encoding not in ("json", "typed"):
        raise SandboxError(f"encoding must be 'json' or 'typed', not {encoding!r}")
    mode = isolation_mode()
    start = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="heldout-sbx-")).resolve()
    try:
        _write_files(scratch, files, setup_files or {})
    except SandboxError:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    uid = random.SystemRandom().randrange(2_000_000, 3_000_000)
    job_dir = Path(tempfile.mkdtemp(prefix="heldout-job-"))
    job_path = job_dir / "job.json"
    try:
        hidden = default_hidden_paths() + [str(Path(p).resolve()) for p in hide_paths]
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    per_call = list(per_call_seconds) if per_call_seconds is not None else [None] * len(calls)
    job = {
        "scratch": str(scratch), "isolation": mode, "uid": uid, "module": module, "function": function,
        "encoding": encoding, "stop_on_error": stop_on_error, "allow_processes": allow_processes,
        "limits": limits.__dict__ if hasattr(limits, "__dict__") else dict(limits),
        "hide": hidden,
        "expose": _python_paths(),
        "calls": [{"args": list(a), "kwargs": dict(k), "seconds": s, "group": g}
                  for (a, k), s, g in zip(calls, per_call, groups if groups is not None else [None] * len(calls))],
    }
    try:
        job_path.write_text(json.dumps(job), encoding="utf-8")
    except (TypeError, ValueError) as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(job_dir, ignore_errors=True)
        raise SandboxError(f"sandbox arguments must be JSON data: {exc}") from exc
    if mode == "root":
        os.chown(scratch, uid, uid)
        for path in scratch.rglob("*"):
            os.chown(path, uid, uid, follow_symlinks=False)
    try:
        outcome = _execute(job_path, scratch, mode, limits, len(calls))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(job_dir, ignore_errors=True)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _write_files(scratch: Path, files: dict[str, str], setup_files: dict[str, str]) -> None:
    for name, text in list(files.items()) + list(setup_files.items()):
        if not isinstance(name, str) or not isinstance(text, str):
            raise SandboxError(f"sandbox files must map str paths to str text, got {name!r}")
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\x00" in name:
            raise SandboxError(f"sandbox file path {name!r} must be relative and stay inside the scratch dir")
        if name in files and rel.parts[0].startswith(_RESERVED_PREFIX):
            raise SandboxError(f"sandbox file path {name!r} uses the reserved prefix {_RESERVED_PREFIX!r}")
        target = scratch.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def _child_env(scratch: Path) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch),
           "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONHASHSEED": "0"}  # reproducible set/dict orders across runs
    # one thread per numeric library: thread pools count against the process limit
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
                "NUMEXPR_NUM_THREADS"):
        env[var] = "1"
    env["NUMBA_CACHE_DIR"] = str(scratch / ".numba_cache")
    return env


def _execute(job_path: Path, scratch: Path, mode: str, limits: RunLimits, n_calls: int) -> SandboxResult:
    read_fd, write_fd = os.pipe()
    # -s -E would also drop PYTHONHASHSEED; the environment is built from scratch instead
    cmd = [sys.executable, "-s", "-c", _CHILD_SOURCE, str(job_path), str(write_fd)]
    if mode != "none":
        cmd = [shutil.which("unshare") or "unshare", *_UNSHARE_ARGS[mode], "--", *cmd]
    stdout_cap = max(limits.max_output_bytes, 64 * 1024)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, pass_fds=(write_fd,), start_new_session=True,
                                env=_child_env(scratch), cwd=str(scratch))
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        return SandboxResult(False, None, f"sandbox could not start Python: {exc}", "sandbox_error", "",
                             0.0, limits, mode)
    os.close(write_fd)
    deadline = time.monotonic() + limits.wall_seconds
    result_buf = bytearray()
    stdout_tail = bytearray()
    stdout_total = 0
    killed_for: str | None = None
    sel = selectors.DefaultSelector()
    sel.register(read_fd, selectors.EVENT_READ, "result")
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    open_streams = 2
    try:
        while open_streams:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                killed_for = "timeout"
                break
            for key, _ in sel.select(timeout=min(remaining, 0.5)):
                fd = key.fd if key.data == "result" else proc.stdout.fileno()
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                if key.data == "result":
                    result_buf += chunk
                    if len(result_buf) > limits.max_output_bytes:
                        killed_for = "output_too_large"
                else:
                    stdout_total += len(chunk)
                    stdout_tail += chunk
                    del stdout_tail[:-STDOUT_TAIL_BYTES]
                    if stdout_total > stdout_cap:
                        killed_for = "stdout_too_large"
            if killed_for:
                break
    finally:
        # close our ends first: a writer blocked on a full pipe (even unshare itself) then fails
        # with EPIPE instead of keeping the namespace alive
        sel.close()
        os.close(read_fd)
        proc.stdout.close()
        _kill_group(proc, mode)
    cpu_used = _reap(proc, timeout=None) or 0.0
    tail = stdout_tail.decode("utf-8", errors="replace")
    return _interpret(result_buf, killed_for, proc.returncode, cpu_used, tail, limits, mode, n_calls)


def _kill_group(proc: subprocess.Popen, mode: str) -> None:
    """Kill everything the run started. With namespaces, killing the namespace's first process
    makes the kernel kill every process in it, and ``unshare`` exits only once they are all gone,
    so waiting for it guarantees nothing survives; the process-group kill covers the rest."""
    if mode != "none" and proc.poll() is None:
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            children = []
        for child in children:
            try:
                os.kill(int(child), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError):
                pass
        _reap(proc, timeout=10.0)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(proc: subprocess.Popen, timeout: float | None) -> float | None:
    """Wait for ``proc`` (at most ``timeout`` s; None = forever), record its exit code and return
    the CPU seconds it and its reaped descendants used (None if it is still running)."""
    if proc.returncode is not None:
        return getattr(proc, "_heldout_cpu", 0.0)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, 0 if deadline is None else os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            proc._heldout_cpu = usage.ru_utime + usage.ru_stime  # type: ignore[attr-defined]
            return proc._heldout_cpu  # type: ignore[attr-defined]
        if deadline is not None and time.monotonic() > deadline:
            return None
        time.sleep(0.005)


def _interpret(result_buf: bytes, killed_for: str | None, returncode: int, cpu_used: float, tail: str,
               limits: RunLimits, mode: str, n_calls: int) -> SandboxResult:
    def fail(kind: str, error: str, calls: list | None = None) -> SandboxResult:
        return SandboxResult(False, None, error, kind, tail, 0.0, limits, mode, calls or [])

    calls: list[dict[str, Any]] = []
    fatal: dict[str, Any] | None = None
    done = False
    if killed_for == "output_too_large":
        return fail("output_too_large", f"output too large: the result exceeded {limits.max_output_bytes} bytes")
    for line in bytes(result_buf).split(b"\n"):
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError) as exc:
            return fail("bad_output", f"bad output: the result channel held invalid data ({str(exc)[:200]})", calls)
        if not isinstance(msg, dict):
            return fail("bad_output", "bad output: the result channel held invalid data", calls)
        if msg.get("fatal"):
            fatal = msg
            break
        if msg.get("done"):
            done = True
            break
        if isinstance(msg.get("call"), int):
            calls.append(msg)
    if fatal is not None:
        kind = fatal.get("error_kind") if fatal.get("error_kind") in ERROR_KINDS else "crash"
        return fail(kind, str(fatal.get("error"))[:8000], calls)
    if killed_for == "timeout":
        return fail("timeout", f"timeout after {limits.wall_seconds:g} s wall (limit)", calls)
    if killed_for == "stdout_too_large":
        return fail("output_too_large", f"output too large: the program printed more than "
                    f"{max(limits.max_output_bytes, 64 * 1024)} bytes", calls)
    if not done:
        if cpu_used >= limits.cpu_seconds - 0.05:
            return fail("timeout", f"timeout: cpu time limit of {limits.cpu_seconds:g} s exceeded", calls)
        if returncode < 0:
            name = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else str(-returncode)
            return fail("crash", f"the program was killed by signal {name}" +
                        (f"\n{tail[-1500:]}" if tail else ""), calls)
        return fail("crash", f"the program exited (code {returncode}) without returning a result" +
                    (f"\n{tail[-1500:]}" if tail else ""), calls)
    failed = [c for c in calls if not c.get("ok")]
    if failed:
        first = failed[0]
        kind = first.get("error_kind") if first.get("error_kind") in ERROR_KINDS else "crash"
        return fail(kind, str(first.get("error"))[:8000], calls)
    if len(calls) != n_calls:
        return fail("crash", f"the program returned {len(calls)} of {n_calls} results", calls)
    return SandboxResult(True, [c.get("value") for c in calls], None, None, tail, 0.0, limits, mode, calls)


def decode_typed(value: Any) -> Any:
    """Turn a value sent with ``encoding="typed"`` back into Python data (tuple, set, frozenset,
    bytes, complex, dicts with any hashable keys). Only these plain types are ever built."""
    if isinstance(value, list):
        return [decode_typed(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (tag, inner), = value.items()
            if tag == "__tuple__":
                return tuple(decode_typed(v) for v in inner)
            if tag == "__set__":
                return {decode_typed(v) for v in inner}
            if tag == "__frozenset__":
                return frozenset(decode_typed(v) for v in inner)
            if tag == "__bytes__":
                return bytes.fromhex(inner)
            if tag == "__complex__":
                return complex(inner[0], inner[1])
            if tag == "__dict__":
                return {decode_typed(k): decode_typed(v) for k, v in inner}
        return {k: decode_typed(v) for k, v in value.items()}
    return value


__all__ = ["decode_typed", "SandboxResult", "SandboxError", "run_function", "run_calls", "isolation_mode",
           "default_hidden_paths", "ERROR_KINDS"]
