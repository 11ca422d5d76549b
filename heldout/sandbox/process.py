"""Sandboxed execution of untrusted code: every candidate program in heldout runs through here.

A candidate runs in a fresh Python (``python -s``, environment built from scratch) inside a
bubblewrap sandbox (:mod:`heldout.sandbox.root`): an **allow-list** root holding only the
interpreter, its packages, the run's code dir (read-only) and a size-capped private tmpfs
scratch; fresh PID/network/IPC/UTS namespaces; a throw-away uid with no capabilities and
``no_new_privs`` when the harness is root. Limits:

* **time is CPU time**: a program's time limits count its own work, the CPU time of the run's
  whole process tree (every process and thread: n busy threads use n seconds a second), read by
  the **parent** from the run's cgroup (or, without one, from ``/proc`` of the run's processes),
  never taken from the child. A verdict then does not depend on how busy the machine is: the same
  program gets the same verdict idle and with every core taken by other work (issue 53). Wall
  time is only a backstop, for a program that sleeps, blocks or waits: ``limits.wall_seconds``
  for the whole run (a task sets it generously from its CPU limit: :func:`wall_backstop`), and
  ``wall_backstop(limit)`` for each call;
* **whole-run** memory, process count and CPU time through a cgroup
  (:mod:`heldout.sandbox.cgroups`), plus per-process rlimits (CPU, address space, file size, open
  files) that give the common cases a clear error (``MemoryError``) before the cgroup kills;
* total scratch size (the tmpfs quota, not a per-file cap);
* per-call CPU limits (``per_call_seconds``): timers in the child (CPU, and the wall backstop) give
  a clean error; the **parent** times each call's CPU itself, fails a call that used more than its
  limit whatever the child says, and kills the run if a call outlives its CPU limit or its wall
  backstop anyway (a program that ignores or blocks signals still times out); the remaining calls
  then run in a fresh sandbox.

**Isolation levels** (:func:`isolation_level`, recorded in every :class:`SandboxResult`):
``bwrap+cgroup-v1``/``bwrap+cgroup-v2``/``bwrap+rlimit`` (the allow-list sandbox; the suffix says
how whole-run limits are enforced), or ``none`` when bubblewrap is unavailable. ``none`` is
**refused** (:class:`NoSandbox`) unless the user opted in with ``--unsafe-no-sandbox``
(``HELDOUT_UNSAFE_NO_SANDBOX=1``); it then runs in a process group with rlimits and an audit hook
only, which a determined candidate can bypass.

Results come back as JSON lines through a size-capped pipe: plain data only, never pickles.
Every failure maps to a named ``error_kind``: ``timeout``, ``memory``, ``crash`` (with the
traceback tail), ``bad_output``, ``forbidden``, ``output_too_large``, and ``sandbox_error``
(the sandbox itself could not be set up: not the candidate's fault). The candidate shares its
process with the result channel, so it can write lines of its own: ``sandbox_error`` is accepted
only before the child announced that isolation is complete, and any other unknown kind is a
``crash``. A candidate can therefore never blame the harness.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import os
import queue
import random
import select
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Sequence

from heldout.contracts import HeldoutError, RunLimits
from heldout.sandbox.cgroups import RunGroup, limits_level
from heldout.sandbox.zygote import (Execution, ForkServer, ForkServerDown, Preload, after_run, discard,
                                    fork_server_enabled, server_for, start_early, wait_readable)
from heldout.sandbox.root import (CODE_DIR, PYTHON_FLAGS, SCRATCH_DIR, AllowList, bwrap_argv, bwrap_probed, child_env,
                                  probe_bwrap, python_path)

CANDIDATE_KINDS = ("timeout", "memory", "crash", "bad_output", "forbidden", "output_too_large")
ERROR_KINDS = CANDIDATE_KINDS + ("sandbox_error",)
ISOLATION_ENV = "HELDOUT_SANDBOX_ISOLATION"
UNSAFE_ENV = "HELDOUT_UNSAFE_NO_SANDBOX"
HIDE_ENV = "HELDOUT_SANDBOX_HIDE"
STDOUT_TAIL_BYTES = 4096
PARENT_SLACK_SECONDS = 0.5  # the child's own timer normally fires first; the parent's is the guarantee
# The wall backstop of a CPU limit: a program that computes gets its CPU limit whatever the load
# (its wall time is its CPU time stretched by the load: ~4.5x beside 8 other runs on 2 cores), and
# one that sleeps or blocks ends here. Generous on purpose: at 4x + 2 s a call that uses its whole
# limit survives a 4x stretch, and a correct MBPP+ solution (about a quarter of its limit) 16x.
WALL_BACKSTOP_FACTOR = 4.0
WALL_BACKSTOP_SECONDS = 2.0
DEFAULT_SCRATCH_MB = 64
_CHILD_SOURCE = (Path(__file__).resolve().parent / "_child.py").read_text(encoding="utf-8")
_RESERVED_PREFIX = "_heldout_"
# the standard modules candidates (MBPP+ solutions, geometry programs) commonly import
STDLIB_PRELOAD = ("re", "math", "cmath", "collections", "itertools", "heapq", "functools", "bisect", "operator",
                  "string", "decimal", "fractions", "statistics", "typing", "hashlib", "random", "dataclasses", "copy",
                  "array", "pickle")
# what program tasks' fork server imports once (one zygote serves them all): numpy and those
# (MBPP+, plain Python, preloads STDLIB_PRELOAD alone: a smaller image that starts sooner)
PROGRAM_PRELOAD = ("numpy", *STDLIB_PRELOAD)
CPU_CHECK_SECONDS = 0.25  # how often the parent reads a running execution's CPU time
UNSERVED_RETRIES = 8  # times an execution asks the fork server again when no spare took it


def wall_backstop(cpu_seconds: float) -> float:
    """The wall time after which a program with a CPU limit of ``cpu_seconds`` is stopped anyway
    (it sleeps, blocks on I/O or waits): the whole run's ``wall_seconds`` a task sets, and each
    call's backstop of ``per_call_seconds``."""
    return WALL_BACKSTOP_FACTOR * cpu_seconds + WALL_BACKSTOP_SECONDS


class SandboxError(HeldoutError):
    """The caller (not the candidate) asked for something impossible, e.g. a bad file path."""


class NoSandbox(SandboxError):
    """No allow-list sandbox can be built here and the user did not pass ``--unsafe-no-sandbox``."""


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
    peak_memory_mb: float | None = None
    forked: bool = False  # every execution ran in a child of a fork server (same isolation)

    def describe_limits(self) -> str:
        lim = self.limits
        return (f"limits: {lim.wall_seconds:g} s wall, {lim.cpu_seconds:g} s cpu, {lim.memory_mb} MB, "
                f"{lim.max_processes} procs, {scratch_mb(lim)} MB scratch, isolation={self.isolation}")


def scratch_mb(limits: RunLimits) -> int:
    """Total size of the private scratch tmpfs."""
    return int(limits.scratch_mb or DEFAULT_SCRATCH_MB)


# -- isolation ---------------------------------------------------------------------------------------
def unsafe_allowed() -> bool:
    """True if the user explicitly allowed running untrusted code without a sandbox."""
    return os.environ.get(UNSAFE_ENV, "") not in ("", "0")


def allow_unsafe_no_sandbox() -> None:
    """What ``--unsafe-no-sandbox`` does (inherited by worker processes through the environment)."""
    os.environ[UNSAFE_ENV] = "1"


def isolation_mode() -> str:
    """``bwrap`` (the allow-list sandbox can be built) or ``none``; probed once per process.
    ``$HELDOUT_SANDBOX_ISOLATION=none`` forces the fallback (which still needs the unsafe opt-in)."""
    forced = os.environ.get(ISOLATION_ENV)
    if forced:
        if forced not in ("bwrap", "none"):
            raise SandboxError(f"${ISOLATION_ENV} must be bwrap or none, not {forced!r}")
        if forced == "bwrap" and probe_bwrap()[0] != "bwrap":
            raise NoSandbox(f"${ISOLATION_ENV}=bwrap but {probe_bwrap()[1]}")
        return forced
    return probe_bwrap()[0]


def isolation_level() -> str:
    """The isolation recorded in results and run records, e.g. ``bwrap+cgroup-v1`` or ``none``."""
    mode = isolation_mode()
    return f"bwrap+{limits_level()}" if mode == "bwrap" else "none"


def require_sandbox() -> str:
    """The isolation level to run untrusted code with, or :class:`NoSandbox` with what to do."""
    mode = isolation_mode()
    if mode == "none" and not unsafe_allowed():
        why = probe_bwrap()[1] if os.environ.get(ISOLATION_ENV) != "none" else f"${ISOLATION_ENV}=none"
        raise NoSandbox(f"refusing to run untrusted code without a sandbox ({why}); install bubblewrap, "
                        f"or pass --unsafe-no-sandbox (${UNSAFE_ENV}=1) to run it unprotected")
    return isolation_level()


def default_hidden_paths() -> list[str]:
    """Unsafe mode only (the audit hook's deny-list, a courtesy, not a guarantee): heldout's source
    tree, the shared data dir next to a checkout, ``$HELDOUT_DATA_DIR``, ``$HELDOUT_SANDBOX_HIDE``."""
    pkg = Path(__file__).resolve().parents[1]
    repo = pkg.parent
    hidden = [pkg, repo.parent / "shared"] if (repo / "pyproject.toml").exists() else [pkg]
    for env in (os.environ.get("HELDOUT_DATA_DIR"), *os.environ.get(HIDE_ENV, "").split(os.pathsep)):
        if env:
            hidden.append(Path(env))
    return sorted({str(Path(h).resolve()) for h in hidden} - {"/"})


# -- the API -----------------------------------------------------------------------------------------
def run_function(files: dict[str, str], module: str, function: str, args: list | tuple = (),
                 kwargs: dict | None = None, *, limits: RunLimits, setup_files: dict[str, str | Path] | None = None,
                 encoding: str = "json", allow_processes: bool = False, preload: Sequence[str] = (),
                 fork_server: bool = True) -> SandboxResult:
    """Write ``files`` (candidate sources; relative paths) plus ``setup_files`` (trusted helper
    modules the task provides, as text; or a data file it built, as a ``Path``, which is linked
    in) into a fresh read-only code dir, start a fresh sandboxed Python,
    import ``module`` and call ``function(*args, **kwargs)``. Args/kwargs cross as JSON. The return
    value is converted to plain JSON data in the child (numpy arrays -> nested lists, tuples ->
    lists, numpy scalars -> float/int; anything else -> ``bad_output``); with
    ``encoding="typed"`` tuples, sets, bytes, complex and non-str dict keys survive as such (the
    result holds them decoded).
    Never raises for anything the candidate does; raises :class:`NoSandbox` if no sandbox can
    be built and the user did not opt out of one.

    By default the execution is forked by the fork server for ``preload`` (modules imported once,
    before any candidate: e.g. ``("numpy",)``; a name of one of the ``setup_files`` helpers, e.g.
    ``"problem"`` for ``problem.py``, is imported from its text), at the same isolation as a fresh sandbox
    (:mod:`heldout.sandbox.zygote`); ``fork_server=False`` or ``$HELDOUT_FORK_SERVER=0`` starts
    a fresh sandbox instead, as does any failure of the fork server."""
    result = run_calls(files, module, function, [(list(args), dict(kwargs or {}))], limits=limits,
                       setup_files=setup_files, encoding=encoding, allow_processes=allow_processes,
                       preload=preload, fork_server=fork_server)
    if result.ok:
        result.value = result.calls[0]["value"]
    return result


def run_calls(files: dict[str, str], module: str, function: str,
              calls: Sequence[tuple[Sequence[Any], dict[str, Any]]], *, limits: RunLimits,
              per_call_seconds: Sequence[float | None] | None = None,
              setup_files: dict[str, str | Path] | None = None, encoding: str = "json",
              stop_on_error: bool = False, allow_processes: bool = False,
              groups: Sequence[str] | None = None, preload: Sequence[str] = (),
              fork_server: bool = True, inputs_up_front: bool = False) -> SandboxResult:
    """Like :func:`run_function`, but call ``function`` once per ``(args, kwargs)`` in ``calls`` in
    one sandboxed process (imports are paid once). ``per_call_seconds`` adds a CPU limit per call,
    with a wall backstop of :func:`wall_backstop` of it (see the module docstring; the overall
    ``limits`` still bound everything). ``result.calls`` holds one outcome per call that ran:
    ``{"call", "ok", "value", "seconds", "cpu_seconds", "bytes"}`` or ``{"call", "ok": False,
    "error_kind", "error", "bytes"}`` (``bytes``: the length of the outcome's line on the
    channel; ``seconds``: the call's wall time; ``cpu_seconds``: its CPU time, measured by the
    parent when the call had a limit, else the child's own report); ``result.value`` is the list of values
    when all succeeded. With ``stop_on_error`` the run stops at the first failing call, or, when
    ``groups`` names a group per call, skips only the rest of the failing call's group.
    ``preload``/``fork_server``: as for :func:`run_function`.

    ``inputs_up_front``: every call's input is written at once instead of each when its clock
    starts, so the calls run back to back without a round trip to the parent each (2,170 inputs of
    20 MBPP+ reference solutions: 0.59 -> 0.47 s here), read through a buffer, and their outcomes
    come back a few writes at a time (64 KiB or 50 ms), not a line each (the same 20: 0.16 -> 0.10
    s, the parent's CPU 0.10 -> 0.05 s). Only for trusted code (a task's reference
    solution): an untrusted program could read later inputs early and work on them on an earlier
    call's clock. Refused with ``per_call_seconds`` or ``stop_on_error``, which need the parent
    to start each call."""
    if encoding not in ("json", "typed"):
        raise SandboxError(f"encoding must be 'json' or 'typed', not {encoding!r}")
    if inputs_up_front and (per_call_seconds is not None or stop_on_error):
        raise SandboxError("inputs_up_front runs the calls back to back: it cannot time each call "
                           "(per_call_seconds) nor stop at a failing one (stop_on_error)")
    preload_set = Preload.of(preload, setup_files)  # the task's helpers among preload: imported by the zygote
    if fork_server and fork_server_enabled() and not bwrap_probed() and os.environ.get(ISOLATION_ENV) != "none":
        start_early(preload_set)  # the first execution of a process: the zygote starts while bwrap is probed
    level = require_sandbox()
    per_call = list(per_call_seconds) if per_call_seconds is not None else [None] * len(calls)
    group_of = list(groups) if groups is not None else [None] * len(calls)
    if not (len(per_call) == len(group_of) == len(calls)):
        raise SandboxError("per_call_seconds and groups need one entry per call")
    try:
        # each call encoded once: checked before anything starts, and every job is made of these
        dumps = json.dumps
        seconds_text, group_text = _json_texts(per_call), _json_texts(group_of)
        wall_text = _json_texts([wall_backstop(s) if s else None for s in per_call])
        encoded_calls = ['{"args": ' + dumps(list(a)) + ', "kwargs": ' + (dumps(dict(k)) if k else "{}") +
                         ', "seconds": ' + seconds_text[i] + ', "wall": ' + wall_text[i] +
                         ', "group": ' + group_text[i] + "}"
                         for i, (a, k) in enumerate(calls)]
    except (TypeError, ValueError, RecursionError) as exc:
        raise SandboxError(f"sandbox arguments must be JSON data: {exc}") from exc
    server = server_for(preload_set) if fork_server and level != "none" and fork_server_enabled() else None
    code = _write_code_dir(files, setup_files or {}, server.new_code_dir() if server else None)
    forked_only = server is not None
    start = time.perf_counter()
    outcomes: dict[int, dict[str, Any]] = {}
    pending = list(range(len(calls)))
    failed_groups: set[str | None] = set()
    last: SandboxResult | None = None
    peak: float | None = None
    unserved = 0
    try:
        while pending:
            wall_left = limits.wall_seconds - (time.perf_counter() - start)
            if wall_left <= 0.05:
                break
            job = {"module": module, "function": function, "encoding": encoding, "stop_on_error": stop_on_error,
                   "allow_processes": allow_processes, "limits": _limits_dict(limits),
                   "hide": default_hidden_paths() if level == "none" else [], "python_path": python_path(),
                   # trusted code whose calls the parent does not time: outcomes come a few at a time
                   "hold_outcomes": inputs_up_front}
            try:
                # the first execution has the whole limit (and names it in its messages); a retry
                # after a parent-enforced call timeout has what is left of it
                run_limits = limits if last is None else limits.replace(wall_seconds=wall_left)
                last = _execute(job, [encoded_calls[i] for i in pending], code, level, run_limits,
                                [per_call[i] for i in pending], [group_of[i] for i in pending], server,
                                inputs_up_front)
            except _UseFreshSandbox as exc:
                if exc.unserved and unserved < UNSERVED_RETRIES:
                    # no spare took it (its prepared spare had died, or a concurrent request that
                    # brought its own group took it): not the fork server's fault, the next one
                    # takes it. Throwing the zygote away for it made concurrent runs fresh ones.
                    unserved += 1
                    continue
                discard(server, str(exc))
                server, forked_only = None, False
                shutil.rmtree(code, ignore_errors=True)
                code = _write_code_dir(files, setup_files or {})
                continue
            peak = max(filter(None, (peak, last.peak_memory_mb)), default=None)
            for local in last.calls:
                outcomes[pending[local["call"]]] = {**local, "call": pending[local["call"]]}
            stopped_by_parent = last.error_kind == "timeout" and any(
                c.get("parent_enforced") for c in last.calls)
            if not stopped_by_parent:
                break
            # a call outlived its limit and the parent killed the run: go on with the calls that
            # still have to run, in a fresh sandbox
            for c in last.calls:
                if not c.get("ok"):
                    failed_groups.add(group_of[pending[c["call"]]])
            done_local = max(c["call"] for c in last.calls)
            rest = pending[done_local + 1:]
            if stop_on_error:
                rest = [i for i in rest if group_of[i] is not None and group_of[i] not in failed_groups]
            pending = rest
    finally:
        if server is not None:
            after_run(lambda: shutil.rmtree(code, ignore_errors=True))
        else:
            shutil.rmtree(code, ignore_errors=True)
    ordered = [outcomes[i] for i in sorted(outcomes)]
    result = _combine(ordered, last, limits, level, len(calls), stop_on_error)
    result.seconds = time.perf_counter() - start
    result.peak_memory_mb = peak
    result.forked = forked_only and last is not None
    return result


def _combine(calls: list[dict[str, Any]], last: SandboxResult | None, limits: RunLimits, level: str,
             n_calls: int, stop_on_error: bool) -> SandboxResult:
    tail = last.stdout_tail if last else ""
    failed = [c for c in calls if not c.get("ok")]
    if failed:
        first = failed[0]
        return SandboxResult(False, None, str(first.get("error"))[:8000], first.get("error_kind") or "crash", tail,
                             0.0, limits, level, calls)
    if last is None:
        return SandboxResult(False, None, f"timeout after {limits.wall_seconds:g} s wall (limit)", "timeout", "",
                             0.0, limits, level, calls)
    if not last.ok:
        return SandboxResult(False, None, last.error, last.error_kind, tail, 0.0, limits, level, calls)
    if len(calls) != n_calls:
        return SandboxResult(False, None, f"the program returned {len(calls)} of {n_calls} results", "crash",
                             tail, 0.0, limits, level, calls)
    return SandboxResult(True, [c.get("value") for c in calls], None, None, tail, 0.0, limits, level, calls)


def _limits_dict(limits: RunLimits) -> dict[str, Any]:
    values = dict(limits.__dict__)
    values["scratch_mb"] = scratch_mb(limits)
    return values


_helper_pycs: dict[str, bytes] = {}  # sha256 of a trusted helper's source -> its pyc


def _helper_bytecode(text: str) -> bytes:
    """A trusted helper's bytecode, compiled once per process, as a checked hash-based pyc (PEP
    552): the sandboxed interpreter (this same one) imports the helper without compiling it in
    every execution, and compiles the source instead should the two ever differ."""
    source = text.encode("utf-8")
    key = hashlib.sha256(source).hexdigest()
    pyc = _helper_pycs.get(key)
    if pyc is None:
        code = compile(source, "helper", "exec", dont_inherit=True)
        pyc = importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little") + importlib.util.source_hash(source) \
            + marshal.dumps(code)
        _helper_pycs[key] = pyc
    return pyc


def _write_code_dir(files: dict[str, str], setup_files: dict[str, str | Path], code: Path | None = None) -> Path:
    """A fresh host dir (or the empty ``code``: a fork server's) with the candidate's files and
    the task's helpers (each with its bytecode) and data files (linked, else copied), readable by
    everyone (it is bound read-only into the sandbox; the candidate cannot change a helper)."""
    code = code or Path(tempfile.mkdtemp(prefix="heldout-code-")).resolve()
    try:
        entries = [(n, t, False) for n, t in files.items()] + [(n, t, True) for n, t in setup_files.items()]
        for name, text, trusted in entries:
            if trusted and isinstance(name, str) and isinstance(text, Path):
                _place_data_file(text, code, name)
                continue
            if not isinstance(name, str) or not isinstance(text, str):
                raise SandboxError(f"sandbox files must map str paths to str text, got {name!r}")
            rel = PurePosixPath(name)
            if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\x00" in name:
                raise SandboxError(f"sandbox file path {name!r} must be relative and stay inside the code dir")
            if not trusted and rel.parts[0].startswith(_RESERVED_PREFIX):
                raise SandboxError(f"sandbox file path {name!r} uses the reserved prefix {_RESERVED_PREFIX!r}")
            target = code.joinpath(*rel.parts)
            if len(rel.parts) > 1:
                _readable_dirs(code, target.parent)
            _write_readable(target, text.encode("utf-8"))
            if trusted and target.suffix == ".py":
                pyc = Path(importlib.util.cache_from_source(str(target)))
                _readable_dirs(code, pyc.parent)
                _write_readable(pyc, _helper_bytecode(text))
        code.chmod(0o755)
    except BaseException:
        shutil.rmtree(code, ignore_errors=True)
        raise
    return code


def _readable_dirs(code: Path, directory: Path) -> None:
    """``directory`` (inside ``code``) and the dirs above it, made if missing, readable by all."""
    missing = []
    while directory != code and not directory.is_dir():
        missing.append(directory)
        directory = directory.parent
    for made in reversed(missing):
        made.mkdir(mode=0o755)
        made.chmod(0o755)  # whatever the umask


def _write_readable(path: Path, data: bytes) -> None:
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644), "wb") as file:
        os.fchmod(file.fileno(), 0o644)  # whatever the umask
        file.write(data)


def _place_data_file(source: Path, code: Path, name: str) -> None:
    """A task's data file in the code dir: a hard link (no copy of a large file per execution),
    or a copy where the two dirs are on different file systems."""
    if "/" in name or name in ("", ".", "..") or "\x00" in name:
        raise SandboxError(f"a data file goes at the top of the code dir, not at {name!r}")
    if not stat.S_ISREG(os.lstat(source).st_mode):  # a link would carry what it names into the sandbox
        raise SandboxError(f"data file {source} is a symbolic link or not a regular file: refused")
    try:
        os.link(source, code / name)
    except OSError:
        shutil.copyfile(source, code / name)
    os.chmod(code / name, 0o644)  # readable by the sandbox's uid, whatever the umask


class _RunState:
    """What the parent learns from the result channel while the child runs.

    The parent keeps each call's clock itself: the first call's starts with the child's start
    line, every later call's as the outcome of the call before it arrives (the child runs them in
    order and, with ``stop_on_error``, skips the rest of a failed call's group, or stops when it
    has none), and only the outcome of the call being timed counts. A clock is the run's CPU time
    (``cpu_clock``: every process and thread of the run, read from outside) and, as a backstop,
    the wall time. A call whose CPU time went past its limit fails as a timeout whatever its
    outcome line says. The candidate shares its process with the channel and can write lines of
    its own; under these rules a forged line can only take time from the candidate, never give it
    more. With ``typed``, a call's value is decoded as its line is parsed (see
    :func:`decode_typed`)."""

    def __init__(self, per_call: list[float | None], groups: Sequence[str | None], stop_on_error: bool,
                 typed: bool, on_call: Callable[[int | None], None] = lambda index: None,
                 cpu_clock: Callable[[], float | None] | None = None) -> None:
        self.on_call = on_call  # told each call as its clock starts (None: no call is left)
        self.per_call = per_call
        # read only where a call has a limit: a run without any does not pay a read per call
        self.cpu_clock = cpu_clock if any(per_call) else None
        self.timed_out_by: str | None = None  # what the parent stopped the running call for: cpu or wall
        self.groups = list(groups)
        self.stop_on_error = stop_on_error
        self.failed_groups: set[str | None] = set()
        # one decoder for the run's lines (json.loads builds one per line); the child writes UTF-8
        self.decode = json.JSONDecoder(object_hook=_typed_object if typed else None).decode
        self.ready = False
        self.done = False
        self.fatal: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}
        self.started = False  # the first call's start line arrived
        # (call, monotonic start, run's CPU seconds at its start) of the call being timed
        self.current: tuple[int, float, float | None] | None = None
        self.bad: str | None = None
        self.buffer = bytearray()

    def feed(self, chunk: bytes) -> None:
        # only the new chunk is searched: a large result arrives in many chunks, and re-splitting
        # the whole buffer each time made its cost quadratic in its size
        if b"\n" not in chunk:
            self.buffer += chunk
            return
        head, *middle, rest = chunk.split(b"\n")
        lines = [bytes(self.buffer) + head, *middle]
        self.buffer = bytearray(rest)
        for line in lines:
            # (isspace, not strip: no copy of a large line)
            if line and not line.isspace() and self.bad is None and self.fatal is None and not self.done:
                self._message(line)

    def _message(self, line: bytes) -> None:
        try:
            msg = self.decode(line.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - invalid JSON, or a tag that builds nothing
            self.bad = f"bad output: the result channel held invalid data ({type(exc).__name__}: {str(exc)[:200]})"
            return
        if not isinstance(msg, dict):
            self.bad = "bad output: the result channel held invalid data"
        elif type(msg.get("call")) is int and _CONTROL_KEYS.isdisjoint(msg):
            self._outcome(msg, len(line))  # by far the commonest line, so it is tested first
        elif msg.get("fatal"):
            self.fatal = msg
        elif msg.get("ready") is True and not self.ready:
            self.ready = True
        elif msg.get("done") is True:
            self.done = True
        elif type(msg.get("start")) is int:
            # the child always begins at call 0
            if not self.started and msg["start"] == 0 and self.per_call:
                self.started = True
                self.current = (msg["start"], time.monotonic(), self._cpu())
                self.on_call(0)
        elif type(msg.get("call")) is int:
            self._outcome(msg, len(line))

    def _outcome(self, msg: dict[str, Any], size: int) -> None:
        """An outcome line: it counts only for the call being timed, whose clock it stops; the
        next call's starts."""
        index = msg["call"]
        if self.current is None or index != self.current[0]:
            return
        # only the child's outcome keys are kept (a forged line may add others, e.g. parent_enforced)
        outcome = msg if msg.keys() <= _OUTCOME_KEYS else {k: msg[k] for k in _OUTCOME_KEYS if k in msg}
        outcome["bytes"] = size
        # one reading ends this call's clock and starts the next one's: every CPU second of the
        # run after the start line is some call's
        reading = self._cpu()
        limit, cpu_start = self.per_call[index], self.current[2]
        if reading is not None and cpu_start is not None:
            used = reading - cpu_start
            outcome["cpu_seconds"] = used  # the parent's measure, not the child's word
            if self._over_cpu_limit(index, used) and outcome.get("ok") is not False:
                # the child said it finished in time (its timer was switched off, its signal
                # blocked ...): the parent's measure decides
                outcome = {"call": index, "ok": False, "error_kind": "timeout", "cpu_seconds": used, "bytes": size,
                           "error": f"timeout: {used:.3g} s cpu used, over the per-call limit of {limit:.3g} s "
                                    f"(measured by the parent)"}
        self.calls[index] = outcome
        following = self._call_after(index, outcome.get("ok") is True)
        self.current = None if following is None else (following, time.monotonic(), reading)
        self.on_call(following)

    def _cpu(self) -> float | None:
        return self.cpu_clock() if self.cpu_clock is not None else None

    def _call_after(self, index: int, ok: bool) -> int | None:
        """The call the child runs after call ``index`` ended (``ok``), or None."""
        if not ok and self.stop_on_error:
            if self.groups[index] is None:
                return None
            self.failed_groups.add(self.groups[index])
        if not self.failed_groups:  # the common case: the next one
            return index + 1 if index + 1 < len(self.per_call) else None
        return next((j for j in range(index + 1, len(self.per_call)) if self.groups[j] not in self.failed_groups), None)

    def call_deadline(self) -> float | None:
        """When the running call's wall backstop runs out (the parent's, after the child's own)."""
        if self.current is None:
            return None
        seconds = self.per_call[self.current[0]]
        return None if not seconds else self.current[1] + wall_backstop(seconds) + PARENT_SLACK_SECONDS

    def call_over_cpu(self, reading: float | None) -> bool:
        """Whether the running call used more CPU than its limit allows (the child's timer should
        have stopped it by now), given the run's CPU seconds ``reading``."""
        if self.current is None or reading is None or self.current[2] is None:
            return False
        return self._over_cpu_limit(self.current[0], reading - self.current[2])

    def _over_cpu_limit(self, index: int, used: float) -> bool:
        """The one rule: call ``index`` used more CPU than its limit and the parent's slack."""
        limit = self.per_call[index]
        return bool(limit) and used > limit + PARENT_SLACK_SECONDS


_OUTCOME_KEYS = frozenset(("call", "ok", "value", "error_kind", "error", "seconds", "cpu_seconds"))
_CONTROL_KEYS = frozenset(("fatal", "ready", "done", "start"))  # a line with one of these is no outcome first


class _UseFreshSandbox(Exception):
    """The fork server could not run this execution (nothing of the candidate ran, or what ran
    is thrown away): run it in a fresh sandbox. ``unserved``: the zygote had no spare to give it
    (not a fault of the fork server's: the execution may ask it once more)."""

    def __init__(self, message: str, unserved: bool = False) -> None:
        super().__init__(message)
        self.unserved = unserved


@dataclass
class _Launched:
    """A started execution, however it was started: the harness's ends of its pipes, its cgroup,
    and how to kill and reap it."""

    result_fd: int
    stdout_fd: int
    job_fd: int
    group: RunGroup
    level_name: str
    kill: Any  # () -> None: every process of the run
    reap: Any  # (need the exit code?) -> (exit code, CPU seconds)
    cpu: Callable[[], float | None]  # the CPU seconds every process of the run used so far
    forked: Execution | None = None


def _launch_fresh(job: dict[str, Any], code: Path, level: str, limits: RunLimits) -> _Launched | SandboxResult:
    read_fd, write_fd = os.pipe()
    privileged = os.geteuid() == 0
    if level == "none":
        scratch = tempfile.mkdtemp(prefix="heldout-sbx-")
        job.update(code=str(code), scratch=scratch)
        prefix: list[str] = []
    else:
        scratch = SCRATCH_DIR
        job.update(code=CODE_DIR, scratch=scratch)
        prefix = [*bwrap_argv(AllowList(code=code, scratch_mb=scratch_mb(limits)), privileged=privileged), "--"]
    # -s -E would also drop PYTHONHASHSEED; the environment is built from scratch instead
    cmd = [*prefix, sys.executable, *PYTHON_FLAGS, "-c", _CHILD_SOURCE, str(write_fd)]
    group = RunGroup.create(memory_mb=limits.memory_mb, max_processes=limits.max_processes) \
        if level != "none" else RunGroup("rlimit")
    level_name = level if level == "none" else f"bwrap+{group.level}"
    cmd = group.attach_argv(cmd)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                pass_fds=(write_fd,), start_new_session=True, env=child_env(scratch),
                                cwd=scratch if level == "none" else "/")
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        group.close()
        return SandboxResult(False, None, f"sandbox could not start Python: {exc}", "sandbox_error", "",
                             0.0, limits, level_name)
    os.close(write_fd)

    def kill() -> None:
        group.kill_run(proc.pid)

    def reap(need_code: bool) -> tuple[int, float]:
        cpu = _reap(proc)
        if level == "none":
            shutil.rmtree(scratch, ignore_errors=True)
        return proc.returncode, cpu

    job_fd = os.dup(proc.stdin.fileno())
    stdout_fd = os.dup(proc.stdout.fileno())
    proc.stdin.close()
    proc.stdout.close()
    # without a CPU controller the run's processes are found under the one the harness started
    cpu = group.cpu_clock() if group.counts_cpu() else (lambda: _tree_cpu_seconds(proc.pid))
    return _Launched(read_fd, stdout_fd, job_fd, group, level_name, kill, reap, cpu)


def _launch_forked(job: dict[str, Any], code: Path, level: str, limits: RunLimits,
                   server: ForkServer) -> _Launched:
    job.update(code=CODE_DIR, scratch=SCRATCH_DIR)
    try:
        ex = server.start(code, child_env(SCRATCH_DIR), scratch_mb(limits), limits.memory_mb, limits.max_processes)
    except ForkServerDown as exc:
        raise _UseFreshSandbox(str(exc)) from exc

    def kill() -> None:
        server.kill(ex)

    def reap(need_code: bool) -> tuple[int | None, float]:
        # a run whose streams closed by themselves is exiting: it is killed only after its exit
        # was reported, which means every process of the run has exited (see wait_exit)
        # (the wait is on the caller's path on purpose: no process of a run may still run, or
        # hold memory or files, when its result is returned)
        if not need_code:
            server.end(ex)
        code = server.wait_exit(ex)
        if code is None:  # no report: whatever is left of the run is killed here, and waited for
            server.kill(ex, wait=True)
        server.finished(ex)
        return code, 0.0

    return _Launched(ex.result, ex.stdout, ex.stdin, ex.group, f"bwrap+{ex.group.level}", kill, reap,
                     ex.group.cpu_clock(), ex)


def _json_texts(values: Sequence[Any]) -> list[str]:
    """``json.dumps`` of each value, each distinct scalar encoded once: a run's per-call limits and
    groups repeat a few values thousands of times (two of a call's three dumps, ~3 us each on an
    idle machine, went there). Keyed by type as well, since 1, 1.0 and True are equal keys but
    encode differently."""
    memo: dict[tuple[type, Any], str] = {}
    out = []
    for value in values:
        if value is None or type(value) in (str, float, int, bool):
            key = (type(value), value)
            text = memo.get(key)
            if text is None:
                text = memo[key] = json.dumps(value)
        else:
            text = json.dumps(value)
        out.append(text)
    return out


def _execute(job: dict[str, Any], encoded_calls: list[str], code: Path, level: str, limits: RunLimits,
             per_call: list[float | None], groups: list[str | None], server: ForkServer | None = None,
             inputs_up_front: bool = False) -> SandboxResult:
    """Run one job (its calls already JSON-encoded), in a child of ``server`` (raises
    :class:`_UseFreshSandbox` if it cannot) or in a fresh sandbox; the monitoring below is the
    same for both."""
    privileged = os.geteuid() == 0
    job["uid"] = random.SystemRandom().randrange(2_000_000, 3_000_000) if privileged and level != "none" else None
    started = _launch_forked(job, code, level, limits, server) if server is not None \
        else _launch_fresh(job, code, level, limits)
    if isinstance(started, SandboxResult):
        return started
    group, level_name = started.group, started.level_name
    read_fd, stdout_fd = started.result_fd, started.stdout_fd
    stdout_cap = max(limits.max_output_bytes, 64 * 1024)
    # the job goes through stdin: its header now, each call when its clock starts (see _CallFeeder)
    feeder = _CallFeeder(started.job_fd, json.dumps(job).encode(), encoded_calls, inputs_up_front)
    state = _RunState(per_call, groups, job["stop_on_error"], typed=job["encoding"] == "typed",
                      on_call=feeder.send, cpu_clock=started.cpu)
    deadline = time.monotonic() + limits.wall_seconds
    stdout_tail = bytearray()
    stdout_total = result_total = 0
    killed_for: str | None = None
    sel = selectors.DefaultSelector()
    sel.register(read_fd, selectors.EVENT_READ, "result")
    sel.register(stdout_fd, selectors.EVENT_READ, "stdout")
    open_streams = 2
    next_cpu_check = time.monotonic() + CPU_CHECK_SECONDS  # at the start the run has used nothing
    monitored = False
    try:
        while open_streams:
            now = time.monotonic()
            call_deadline = state.call_deadline()
            if now >= deadline:
                killed_for = "timeout"
                break
            if call_deadline is not None and now >= call_deadline:
                killed_for, state.timed_out_by = "call_timeout", "wall"
                break
            if now >= next_cpu_check:
                used = started.cpu()
                if used is not None and used > limits.cpu_seconds + 0.5:
                    killed_for = "cpu"
                    break
                if state.call_over_cpu(used):
                    killed_for, state.timed_out_by = "call_timeout", "cpu"
                    break
                next_cpu_check = now + CPU_CHECK_SECONDS
            wait = min(deadline, call_deadline or deadline, next_cpu_check) - now
            for key, _ in sel.select(timeout=max(0.0, min(wait, 0.5))):
                was_ready = state.ready
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    open_streams -= 1
                    continue
                if key.data == "result":
                    result_total += len(chunk)
                    if result_total > limits.max_output_bytes:
                        killed_for = "output_too_large"
                    else:
                        state.feed(chunk)
                    if started.forked is not None and state.ready and not was_ready and not group.was_joined():
                        # a child that says it is isolated must be in its cgroup (checked here, on
                        # the host; a fast run may have exited already, so its charges count too):
                        # otherwise the fork server is not to be trusted with more runs
                        killed_for = "fork_server"
                else:
                    stdout_total += len(chunk)
                    stdout_tail += chunk
                    del stdout_tail[:-STDOUT_TAIL_BYTES]
                    if stdout_total > stdout_cap:
                        killed_for = "stdout_too_large"
            if killed_for or state.done or state.fatal or state.bad:
                break
        if state.done and not killed_for and stdout_fd in sel.get_map():
            # prints flushed before "done" may still sit in the pipe: keep what is already there
            late = _ready_bytes(stdout_fd, stdout_cap - stdout_total)
            stdout_total += len(late)
            stdout_tail += late
            del stdout_tail[:-STDOUT_TAIL_BYTES]
        monitored = True
    finally:
        feeder.close()
        # close our ends first: a writer blocked on a full pipe then fails instead of hanging
        sel.close()
        os.close(read_fd)
        os.close(stdout_fd)
        # a forked run that ended by itself is killed by ``reap`` without waiting for its
        # cgroup to empty: the zygote's exit report already means its whole tree is gone
        if not monitored or started.forked is None or killed_for:
            started.kill()
        if not monitored:
            started.reap(False)
    # the exit code only words the message of a run that ended without its outcome on the channel
    ended_by_itself = not state.done and killed_for is None and not state.bad and state.fatal is None
    returncode, cpu_used = started.reap(ended_by_itself)
    # a forked run that ended without its outcome, and whose exit the zygote never reported: the
    # zygote went away under it (its runs die with it), so nothing says the program ended the run
    lost = returncode is None and ended_by_itself
    if returncode is None:
        returncode = -signal.SIGKILL
    # the CPU used only words the message of a run that did not finish
    group_cpu = None if state.done else group.cpu_seconds()
    if group_cpu is not None:
        cpu_used = max(cpu_used, group_cpu)
    # the limit counters only word the message of a run that did not finish
    memory_hit = not state.done and group.memory_exceeded()
    procs_hit = not state.done and group.processes_exceeded()
    peak = group.peak_memory_mb()
    unserved = started.forked is not None and server is not None and server.unserved(started.forked)
    if unserved:
        # no spare took it: what may be left in its group is a spare the zygote gave another
        # request, which moves it out; the group is only removed, never killed
        after_run(group.remove)
    elif started.forked is not None:
        after_run(group.close)  # every process is dead or SIGKILLed; emptying the group can wait
    else:
        group.close()
    tail = stdout_tail.decode("utf-8", errors="replace")
    if started.forked is not None and (killed_for == "fork_server" or (not state.ready and not state.done)):
        # the fork server could not isolate this child (nothing of the candidate ran before
        # "ready"): it is thrown away and the execution runs in a fresh sandbox
        raise _UseFreshSandbox(f"the fork server could not set up an execution (exit code {returncode}): "
                               f"{tail[-500:]}", unserved=unserved)
    if lost:
        # what ran is thrown away: the execution runs again, whole, in a fresh sandbox
        raise _UseFreshSandbox("the fork server went away during an execution (it never reported the run's exit)")
    result = _interpret(state, killed_for, returncode, cpu_used, memory_hit, procs_hit, tail, limits,
                        level_name)
    result.peak_memory_mb = peak
    return result


def _ready_bytes(fd: int, limit: int) -> bytes:
    """What can be read from ``fd`` without waiting, up to ``limit`` bytes (a program that keeps
    writing cannot hold the parent here: it stops at the limit)."""
    got = bytearray()
    while len(got) < limit and wait_readable(fd, 0):
        chunk = os.read(fd, min(65536, limit - len(got)))
        if not chunk:
            break
        got += chunk
    return bytes(got)


class _CallFeeder:
    """Writes one execution's job stream: the header (the job without its calls) at once, then
    each call's input only when the parent starts that call's clock (:meth:`send`, from
    :class:`_RunState`), so no input is in the candidate's process before its call, and work on an
    input is timed. Frames are ``<length>\n<bytes>``; ``send(None)`` or :meth:`close` ends the
    stream. With ``up_front`` (trusted code only: see :func:`run_calls`) every call follows the
    header at once, then the end of the stream, and :meth:`send` has nothing left to do.

    The pipe is non-blocking: a frame goes out on the caller's thread when the pipe takes all of
    it and nothing is waiting before it (the common case: one write, no other thread to wake,
    ~15 us less per call); the rest of a frame the pipe refuses, and every frame after it, go to a
    writer thread, so a child that stops reading never blocks the monitoring loop. Frames keep
    their order, and the end of the stream comes after the last of them."""

    def __init__(self, fd: int, header: bytes, encoded_calls: Sequence[str], up_front: bool = False) -> None:
        self._fd = fd
        self._calls = encoded_calls
        self._up_front = up_front
        self._lock = threading.Lock()
        # under _lock: items handed to the writer thread and not done yet (a frame, or None: the
        # end of the stream); whether the end was asked for, the pipe broke, the fd is closed
        self._queued = 0
        self._ended = self._broken = self._closed = False
        self._queue: queue.SimpleQueue[bytes | object | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        os.set_blocking(fd, False)
        self._put(self._frame(header))
        if up_front:
            for index in range(len(encoded_calls)):
                self._put(self._call_frame(index))
        if not encoded_calls or up_front:
            self._put(None)

    _STOP = object()  # tells an idle writer thread to end (the fd was closed without it)

    @staticmethod
    def _frame(payload: bytes) -> bytes:
        return str(len(payload)).encode() + b"\n" + payload

    def _call_frame(self, index: int) -> bytes:
        return self._frame(('{"index": ' + str(index) + ", " + self._calls[index][1:]).encode())

    def send(self, index: int | None) -> None:
        if self._up_front:
            return
        self._put(None if index is None else self._call_frame(index))

    def close(self) -> None:
        self._put(None)

    def _put(self, frame: bytes | None) -> None:
        """Write ``frame`` (None: end the stream) now if nothing waits before it, else queue it."""
        with self._lock:
            if self._ended:
                return
            self._ended = frame is None
            if self._broken and frame is not None:
                return  # the child is gone: nothing more to tell it
            if self._queued == 0:
                # nothing before it (the writer thread, if any, is idle): the pipe is this thread's
                if frame is None:
                    self._close_fd()
                    if self._thread is not None:
                        self._queue.put(self._STOP)
                    return
                try:
                    written = os.write(self._fd, frame)
                except BlockingIOError:
                    written = 0
                except OSError:
                    self._broken = True
                    return
                if written == len(frame):
                    return
                frame = frame[written:]
            self._queued += 1
            self._queue.put(frame)
            if self._thread is None:
                self._thread = threading.Thread(target=self._write, daemon=True)
                self._thread.start()

    def _close_fd(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                os.close(self._fd)
            except OSError:
                pass

    def _write(self) -> None:
        # only this thread touches the fd while it has items; it closes it at the end of the
        # stream if that came after them (a close from another thread could let the number be
        # reused under a write here)
        writable = select.poll()  # not select(): the fd may be numbered above FD_SETSIZE
        writable.register(self._fd, select.POLLOUT)
        while (frame := self._queue.get()) is not self._STOP:
            if frame is None:
                with self._lock:
                    self._queued -= 1
                    self._close_fd()
                return
            view = memoryview(frame)
            while view and not self._broken:
                try:
                    view = view[os.write(self._fd, view):]
                except BlockingIOError:
                    writable.poll(1000)  # until the child reads (or is gone)
                except OSError:
                    with self._lock:
                        self._broken = True  # the child is gone: what follows is dropped
            with self._lock:
                self._queued -= 1


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _tree_cpu_seconds(root: int) -> float | None:
    """CPU seconds used by process ``root`` and its descendants (alive, and reaped by one of them),
    from ``/proc``: the run's clock where no cgroup counts its CPU. None once ``root`` is gone."""
    children: dict[int, list[int]] = {}
    used: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        # utime, stime, and cutime, cstime: the children it reaped
        used[pid] = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    if root not in used:
        return None
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += used.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / _CLOCK_TICKS


def _reap(proc: subprocess.Popen) -> float:
    """Wait for ``proc``, record its exit code and return the CPU seconds it and its reaped
    descendants used."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def _interpret(state: _RunState, killed_for: str | None, returncode: int, cpu_used: float, memory_hit: bool,
               procs_hit: bool, tail: str, limits: RunLimits, level: str) -> SandboxResult:
    calls = [state.calls[i] for i in sorted(state.calls)]

    def fail(kind: str, error: str) -> SandboxResult:
        return SandboxResult(False, None, error, kind, tail, 0.0, limits, level, calls)

    if killed_for == "output_too_large":
        return fail("output_too_large", f"output too large: the result exceeded {limits.max_output_bytes} bytes")
    if state.bad:
        return fail("bad_output", state.bad)
    if state.fatal is not None:
        kind = state.fatal.get("error_kind")
        if kind == "sandbox_error" and state.ready:
            # written by the candidate: only the child's own setup (before "ready") may say this
            kind, note = "crash", " (the program claimed a sandbox error after the sandbox was ready)"
        else:
            note = ""
        if kind not in ERROR_KINDS:
            kind = "crash"
        return fail(kind, str(state.fatal.get("error"))[:8000] + note)
    if killed_for == "call_timeout":
        index = state.current[0]  # type: ignore[index]
        seconds = state.per_call[index]
        if state.timed_out_by == "cpu":
            error = (f"timeout: over {seconds:.3g} s cpu (per-call limit, enforced by the parent: the program "
                     f"did not stop when signalled)")
        else:
            error = (f"timeout after {wall_backstop(seconds):.3g} s wall (the per-call backstop of its {seconds:.3g} s "
                     f"cpu limit, enforced by the parent: the program sleeps or waits, and did not stop when "
                     f"signalled)")
        calls.append({"call": index, "ok": False, "error_kind": "timeout", "parent_enforced": True,
                      "error": error, "bytes": 0})
        return SandboxResult(False, None, calls[-1]["error"], "timeout", tail, 0.0, limits, level, calls)
    if killed_for == "timeout":
        return fail("timeout", f"timeout after {limits.wall_seconds:g} s wall (limit)")
    if killed_for == "cpu":
        return fail("timeout", f"timeout: cpu time limit of {limits.cpu_seconds:g} s exceeded (whole run)")
    if killed_for == "stdout_too_large":
        return fail("output_too_large", f"output too large: the program printed more than "
                    f"{max(limits.max_output_bytes, 64 * 1024)} bytes")
    if not state.ready and not state.done:
        return fail("sandbox_error", f"the sandbox could not be set up (exit code {returncode})" +
                    (f"\n{tail[-1500:]}" if tail else ""))
    if not state.done:
        if memory_hit:
            return fail("memory", f"memory limit exceeded: the run's processes together used more than "
                                  f"{limits.memory_mb} MB (whole-run limit)")
        if cpu_used >= limits.cpu_seconds - 0.05:
            return fail("timeout", f"timeout: cpu time limit of {limits.cpu_seconds:g} s exceeded")
        how = f"the program exited (code {returncode}) without returning a result"
        if returncode < 0:
            name = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ \
                else str(-returncode)
            how = f"the program was killed by signal {name}"
        if procs_hit:
            how += f" (process limit of {limits.max_processes} reached)"
        return fail("crash", how + (f"\n{tail[-1500:]}" if tail else ""))
    failed = [c for c in calls if not c.get("ok")]
    for c in failed:
        if c.get("error_kind") not in CANDIDATE_KINDS:
            c["error_kind"] = "crash"  # a call's failure is always the program's
    if failed:
        first = failed[0]
        error = str(first.get("error"))[:8000]
        if first["error_kind"] == "memory" or memory_hit:
            return fail("memory", error)
        return fail(first["error_kind"], error)
    return SandboxResult(True, [c.get("value") for c in calls], None, None, tail, 0.0, limits, level, calls)


def _typed_object(obj: dict[str, Any]) -> Any:
    """The ``json`` object hook of the typed encoding: a one-item object whose key is a tag is the
    value it tags (its inner values are already built, the parser works inside out); any other
    object stays a dict. Raises on a tag whose contents build nothing (only forged data does)."""
    if len(obj) == 1:
        (tag, inner), = obj.items()
        build = _TYPED_TAGS.get(tag)
        if build is not None:
            return build(inner)
    return obj


_TYPED_TAGS = {"__tuple__": tuple, "__set__": set, "__frozenset__": frozenset, "__bytes__": bytes.fromhex,
               "__complex__": lambda parts: complex(parts[0], parts[1]),
               "__dict__": lambda pairs: {k: v for k, v in pairs}}


def decode_typed(value: Any) -> Any:
    """Turn a value in the wire form of ``encoding="typed"`` (plain JSON data with tagged objects)
    back into Python data: tuple, set, frozenset, bytes, complex, dicts with any hashable keys.
    Only these plain types are ever built. The sandbox's own results need none of this: it
    decodes each typed call's value as it parses the call's line. (Given a decoded value, this
    returns an equal one, except that a dict which merely looks like a tag becomes the tagged
    value.)"""
    if isinstance(value, list):
        return [decode_typed(v) for v in value]
    if isinstance(value, dict):
        return _typed_object({k: decode_typed(v) for k, v in value.items()})
    return value


__all__ = ["decode_typed", "wall_backstop", "SandboxResult", "SandboxError", "NoSandbox", "run_function", "run_calls",
           "isolation_mode", "isolation_level", "require_sandbox", "allow_unsafe_no_sandbox", "unsafe_allowed",
           "child_env", "ERROR_KINDS", "CANDIDATE_KINDS", "PROGRAM_PRELOAD", "STDLIB_PRELOAD"]
