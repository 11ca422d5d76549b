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

One execution reads top-down in :func:`_execute`: :mod:`heldout.sandbox.launcher` starts it
(forked or fresh: every zygote and cgroup call is there), :mod:`heldout.sandbox.monitor` watches
it (the wait loop, the limits the parent enforces, the CPU clock it reads them by) and says what
it saw, the launcher ends it (the one kill sequence,
:meth:`~heldout.sandbox.cgroups.RunGroup.kill_run` or the zygote's, then the reap and the group's
counters, in one call each), and :func:`_interpret` names the outcome by the first rule that
holds. One execution enters each of those modules at most twice (tests/test_sandbox_layout.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import os
import shutil
import signal
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from heldout.contracts import HeldoutError, RunLimits, wall_backstop
from heldout.files import make_temp_dir
from heldout.sandbox.cgroups import limits_level
from heldout.sandbox.launcher import CouldNotStart, Ended, Launcher, UseFreshSandbox, scratch_mb
from heldout.sandbox.monitor import Watch, Watched
from heldout.sandbox.root import probe_bwrap

CANDIDATE_KINDS = ("timeout", "memory", "crash", "bad_output", "forbidden", "output_too_large")
ERROR_KINDS = CANDIDATE_KINDS + ("sandbox_error",)
ISOLATION_ENV = "HELDOUT_SANDBOX_ISOLATION"
UNSAFE_ENV = "HELDOUT_UNSAFE_NO_SANDBOX"
HIDE_ENV = "HELDOUT_SANDBOX_HIDE"
_RESERVED_PREFIX = "_heldout_"
# the standard modules candidates (MBPP+ solutions, geometry programs) commonly import
STDLIB_PRELOAD = ("re", "math", "cmath", "collections", "itertools", "heapq", "functools", "bisect", "operator",
                  "string", "decimal", "fractions", "statistics", "typing", "hashlib", "random", "dataclasses", "copy",
                  "array", "pickle")
# what program tasks' fork server imports once (one zygote serves them all): numpy and those
# (MBPP+, plain Python, preloads STDLIB_PRELOAD alone: a smaller image that starts sooner)
PROGRAM_PRELOAD = ("numpy", *STDLIB_PRELOAD)


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
    launcher = Launcher(preload, setup_files, fork_server, os.environ.get(ISOLATION_ENV) == "none",
                        lambda home: _write_code_dir(files, setup_files or {}, home))
    level = require_sandbox()
    per_call = list(per_call_seconds) if per_call_seconds is not None else [None] * len(calls)
    group_of = list(groups) if groups is not None else [None] * len(calls)
    if not (len(per_call) == len(group_of) == len(calls)):
        raise SandboxError("per_call_seconds and groups need one entry per call")
    encoded_calls = _encode_calls(calls, per_call, group_of)
    launcher.connect(level)  # the zygote, and the code dir written where it can see it
    job = {"module": module, "function": function, "encoding": encoding, "stop_on_error": stop_on_error,
           "allow_processes": allow_processes, "limits": _limits_dict(limits),
           "hide": default_hidden_paths() if level == "none" else [],
           # trusted code whose calls the parent does not time: outcomes come a few at a time
           "hold_outcomes": inputs_up_front}
    run = _Run(launcher, level, limits, job, encoded_calls, per_call, group_of, inputs_up_front)
    start = time.perf_counter()
    try:
        run.all_calls(start)
    finally:
        launcher.close()
    ordered = [run.outcomes[i] for i in sorted(run.outcomes)]
    result = _combine(ordered, run.last, limits, level, len(calls), stop_on_error)
    result.seconds = time.perf_counter() - start
    result.peak_memory_mb = run.peak
    result.forked = launcher.forked and run.last is not None
    return result


def _encode_calls(calls: Sequence[tuple[Sequence[Any], dict[str, Any]]], per_call: list[float | None],
                  group_of: list[str | None]) -> list[str]:
    """Each call encoded once: checked before anything starts, and every job is made of these."""
    try:
        dumps = json.dumps
        seconds_text, group_text = _json_texts(per_call), _json_texts(group_of)
        wall_text = _json_texts([wall_backstop(s) if s else None for s in per_call])
        return ['{"args": ' + dumps(list(a)) + ', "kwargs": ' + (dumps(dict(k)) if k else "{}") +
                ', "seconds": ' + seconds_text[i] + ', "wall": ' + wall_text[i] + ', "group": ' + group_text[i] + "}"
                for i, (a, k) in enumerate(calls)]
    except (TypeError, ValueError, RecursionError) as exc:
        raise SandboxError(f"sandbox arguments must be JSON data: {exc}") from exc


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


class _Run:
    """One ``run_calls`` on its way: the calls that still have to run, the outcomes so far, and
    the last execution's result. Usually one execution runs every call; after a call the parent
    had to kill (past its limit), the calls after it run in a fresh execution."""

    def __init__(self, launcher: Launcher, level: str, limits: RunLimits, job: dict[str, Any],
                 encoded_calls: list[str], per_call: list[float | None], group_of: list[str | None],
                 inputs_up_front: bool) -> None:
        self.launcher, self.level, self.limits, self.job = launcher, level, limits, job
        self.encoded_calls, self.per_call, self.group_of = encoded_calls, per_call, group_of
        self.inputs_up_front = inputs_up_front
        self.outcomes: dict[int, dict[str, Any]] = {}
        self.pending = list(range(len(encoded_calls)))
        self.failed_groups: set[str | None] = set()
        self.last: SandboxResult | None = None
        self.peak: float | None = None

    def all_calls(self, start: float) -> None:
        """Execute until no call is left, or the run's wall time is (nearly) spent; when the
        fork server cannot serve an execution, ask it again or go on in fresh sandboxes."""
        while self.pending:
            wall_left = self.limits.wall_seconds - (time.perf_counter() - start)
            if wall_left <= 0.05:
                return
            # the first execution has the whole limit (and names it in its messages); a retry
            # after a parent-enforced call timeout has what is left of it
            limits = self.limits if self.last is None else self.limits.replace(wall_seconds=wall_left)
            try:
                self.last = _execute(self, dict(self.job), limits)
            except UseFreshSandbox as exc:
                self.launcher.fall_back(exc)
                continue
            if not self._record(self.last):
                return

    def _record(self, last: SandboxResult) -> bool:
        """Keep an execution's outcomes; True when the run goes on: a call outlived its limit and
        the parent killed the execution, so the calls after it (those still due) go to a new one."""
        self.peak = max(filter(None, (self.peak, last.peak_memory_mb)), default=None)
        pending = self.pending
        for local in last.calls:
            self.outcomes[pending[local["call"]]] = {**local, "call": pending[local["call"]]}
        if not (last.error_kind == "timeout" and any(c.get("parent_enforced") for c in last.calls)):
            return False
        for c in last.calls:
            if not c.get("ok"):
                self.failed_groups.add(self.group_of[pending[c["call"]]])
        rest = pending[max(c["call"] for c in last.calls) + 1:]
        if self.job["stop_on_error"]:
            rest = [i for i in rest if self.group_of[i] is not None and self.group_of[i] not in self.failed_groups]
        self.pending = rest
        return True


def _execute(run: _Run, job: dict[str, Any], limits: RunLimits) -> SandboxResult:
    """One execution of the run's pending calls, top to bottom: the launcher starts it (forked,
    or fresh), the monitor watches it to its end, the launcher ends it (kills what is left, reaps,
    reads its group's counters), and its watch and end make the result. Raises
    :class:`UseFreshSandbox` when the fork server could not run it."""
    try:
        started = run.launcher.launch(job, run.level, limits)
    except CouldNotStart as exc:
        return SandboxResult(False, None, str(exc), "sandbox_error", "", 0.0, limits, exc.level)
    pending = run.pending
    watch = Watch(started, job, [run.encoded_calls[i] for i in pending], limits, [run.per_call[i] for i in pending],
                  [run.group_of[i] for i in pending], run.inputs_up_front)
    try:
        seen = watch.run()
    except BaseException:
        started.abandon()
        raise
    ended = started.end(killed=seen.killed_for is not None, finished=seen.state.done, by_itself=seen.by_itself,
                        set_up=seen.set_up, tail=seen.stdout_tail)
    result = _interpret(seen, ended, limits, started.level)
    result.peak_memory_mb = ended.peak_memory_mb
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
        pyc = (importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little") + importlib.util.source_hash(source)
               + marshal.dumps(code))
        _helper_pycs[key] = pyc
    return pyc


def _write_code_dir(files: dict[str, str], setup_files: dict[str, str | Path], code: Path | None = None) -> Path:
    """A fresh host dir (or the empty ``code``: a fork server's) with the candidate's files and
    the task's helpers (each with its bytecode) and data files (linked, else copied), readable by
    everyone (it is bound read-only into the sandbox; the candidate cannot change a helper)."""
    code = code or make_temp_dir("code-")
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
                # beside the source, where the sandboxed interpreter looks (not cache_from_source:
                # under the harness's sys.pycache_prefix it named a file outside the code dir)
                pyc = target.parent / "__pycache__" / f"{target.stem}.{sys.implementation.cache_tag}.pyc"
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


def _interpret(seen: Watched, ended: Ended, limits: RunLimits, level: str) -> SandboxResult:
    """The result of one execution, from what the monitor saw and how the run ended: the first
    rule that holds, in this order, names its ``error_kind``."""
    state, killed_for, tail = seen.state, seen.killed_for, seen.stdout_tail
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
        calls.append(_parent_enforced_timeout(seen))
        return SandboxResult(False, None, calls[-1]["error"], "timeout", tail, 0.0, limits, level, calls)
    if killed_for == "timeout":
        waited = f", and {seen.waited_for_cpu:.3g} s it waited for a CPU" if seen.waited_for_cpu else ""
        return fail("timeout", f"timeout after {limits.wall_seconds:g} s wall (limit{waited})")
    if killed_for == "cpu":
        return fail("timeout", f"timeout: cpu time limit of {limits.cpu_seconds:g} s exceeded (whole run)")
    if killed_for == "stdout_too_large":
        return fail("output_too_large", f"output too large: the program printed more than "
                    f"{max(limits.max_output_bytes, 64 * 1024)} bytes")
    if not state.ready and not state.done:
        return fail("sandbox_error", f"the sandbox could not be set up (exit code {ended.returncode})" +
                    (f"\n{tail[-1500:]}" if tail else ""))
    if not state.done:
        kind, error = _unfinished(ended, limits)
        return fail(kind, error + (f"\n{tail[-1500:]}" if tail and kind == "crash" else ""))
    failed = [c for c in calls if not c.get("ok")]
    for c in failed:
        if c.get("error_kind") not in CANDIDATE_KINDS:
            c["error_kind"] = "crash"  # a call's failure is always the program's
    if failed:
        first = failed[0]
        error = str(first.get("error"))[:8000]
        if first["error_kind"] == "memory" or ended.memory_hit:
            return fail("memory", error)
        return fail(first["error_kind"], error)
    return SandboxResult(True, [c.get("value") for c in calls], None, None, tail, 0.0, limits, level, calls)


def _parent_enforced_timeout(seen: Watched) -> dict[str, Any]:
    """The outcome of the call the parent killed the run for: past its CPU limit, or its wall
    backstop, and still running."""
    index = seen.state.current[0]  # type: ignore[index]
    seconds = seen.state.per_call[index]
    if seen.state.timed_out_by == "cpu":
        error = (f"timeout: over {seconds:.3g} s cpu (per-call limit, enforced by the parent: the program "
                 f"did not stop when signalled)")
    else:
        error = (f"timeout after {wall_backstop(seconds):.3g} s wall (the per-call backstop of its {seconds:.3g} s "
                 f"cpu limit, enforced by the parent: the program sleeps or waits, and did not stop when "
                 f"signalled)")
    return {"call": index, "ok": False, "error_kind": "timeout", "parent_enforced": True, "error": error, "bytes": 0}


def _unfinished(ended: Ended, limits: RunLimits) -> tuple[str, str]:
    """Why a run that was set up ended without saying it was done: its group's memory limit, its
    CPU limit, or the program itself (its exit code or signal, and the process limit if hit)."""
    if ended.memory_hit:
        return "memory", (f"memory limit exceeded: the run's processes together used more than "
                          f"{limits.memory_mb} MB (whole-run limit)")
    if ended.cpu_seconds >= limits.cpu_seconds - 0.05:
        return "timeout", f"timeout: cpu time limit of {limits.cpu_seconds:g} s exceeded"
    returncode = ended.returncode
    how = f"the program exited (code {returncode}) without returning a result"
    if returncode < 0:
        known = -returncode in signal.Signals._value2member_map_
        how = f"the program was killed by signal {signal.Signals(-returncode).name if known else -returncode}"
    if ended.processes_hit:
        how += f" (process limit of {limits.max_processes} reached)"
    return "crash", how


__all__ = ["SandboxResult", "SandboxError", "NoSandbox", "run_function", "run_calls", "isolation_mode",
           "isolation_level", "require_sandbox", "allow_unsafe_no_sandbox", "unsafe_allowed", "ERROR_KINDS",
           "CANDIDATE_KINDS", "PROGRAM_PRELOAD", "STDLIB_PRELOAD"]
