"""How an execution starts and ends: forked by the fork server of the run's preload set
(:mod:`heldout.sandbox.zygote`) or in a fresh bubblewrap sandbox (:mod:`heldout.sandbox.root`),
each in a cgroup of its own (:mod:`heldout.sandbox.cgroups`). Every call into those three modules
that an execution makes is made here (one to start it, one to end it, each);
:mod:`heldout.sandbox.monitor` watches what this module started (reading the group's live counters
itself, where the group says they are), and :mod:`heldout.sandbox.process` reads the outcome.

A :class:`Launcher` serves one ``run_calls``: it takes the zygote for the run (or none) and falls
back to fresh sandboxes when the zygote cannot serve it. Each execution it starts is a
:class:`Launched`: the harness's ends of its pipes, its group, and :meth:`Launched.end`, which kills
what is left, reaps it and reads the group's counters into :class:`Ended`."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from heldout.contracts import RunLimits
from heldout.files import make_temp_dir
from heldout.sandbox.cgroups import GroupCounts, RunGroup
from heldout.sandbox.cleanup import after_run
from heldout.sandbox.root import (CODE_DIR, PYTHON_FLAGS, SCRATCH_DIR, AllowList, bwrap_argv, bwrap_probed, child_env,
                                  python_path)
from heldout.sandbox.zygote import (Execution, ForkServer, ForkServerDown, Preload, discard, fork_server_enabled,
                                    server_for, start_early)

DEFAULT_SCRATCH_MB = 64
UNSERVED_RETRIES = 8  # times an execution asks the fork server again when no spare took it
_CHILD_SOURCE = (Path(__file__).resolve().parent / "_child.py").read_text(encoding="utf-8")


def scratch_mb(limits: RunLimits) -> int:
    """Total size of the private scratch tmpfs."""
    return int(limits.scratch_mb or DEFAULT_SCRATCH_MB)


class UseFreshSandbox(Exception):
    """The fork server could not run this execution (nothing of the candidate ran, or what ran
    is thrown away): run it in a fresh sandbox. ``unserved``: the zygote had no spare to give it
    (not a fault of the fork server's: the execution may ask it once more)."""

    def __init__(self, message: str, unserved: bool = False) -> None:
        super().__init__(message)
        self.unserved = unserved


class CouldNotStart(Exception):
    """A fresh sandbox's Python could not be started (the harness's fault, never the candidate's);
    ``level`` is the isolation it was to have."""

    def __init__(self, message: str, level: str) -> None:
        super().__init__(message)
        self.level = level


@dataclass
class Ended:
    """What the harness learns once an execution's processes are gone: the exit code (bwrap's
    convention; -SIGKILL when none was reported), the CPU seconds its processes used, whether
    its group hit the memory or process limit, and its peak memory."""

    returncode: int
    cpu_seconds: float
    memory_hit: bool
    processes_hit: bool
    peak_memory_mb: float | None


class Launcher:
    """Where one run's executions start: children of the zygote for ``preload`` (with
    ``setup_files``' helpers among it), unless ``fork_server`` is False, the fork server is off
    here, or the run is unsandboxed; then, or once the zygote fails it, fresh sandboxes."""

    def __init__(self, preload: Sequence[str], setup_files: dict[str, Any] | None, fork_server: bool,
                 isolation_forced_off: bool, write_code_dir: Callable[[Path | None], Path]) -> None:
        self.preload = Preload.of(preload, setup_files)  # the task's helpers among it: imported by the zygote
        self.wants_server = fork_server and fork_server_enabled()
        self.server: ForkServer | None = None
        self.unserved = 0
        # writes the run's code dir into the empty dir given (a zygote's), or a fresh one (None)
        self._write_code_dir = write_code_dir
        self.code: Path | None = None
        # what the sandboxed interpreter adds to its sys.path: the run's, the same for each execution
        self.python_path = python_path()
        if self.wants_server and not bwrap_probed() and not isolation_forced_off:
            start_early(self.preload)  # the first execution of a process: the zygote starts while bwrap is probed

    def connect(self, level: str) -> None:
        """Take the zygote for the run, now that its isolation ``level`` is known (none for an
        unsandboxed run, or when none can be had right now), and write the run's code dir: in the
        zygote's inbox, or a fresh one."""
        self.server = server_for(self.preload) if self.wants_server and level != "none" else None
        self.code = self._write_code_dir(self.server.new_code_dir() if self.server is not None else None)

    @property
    def forked(self) -> bool:
        """Every execution so far was a zygote's child."""
        return self.server is not None

    def fall_back(self, failure: UseFreshSandbox) -> None:
        """After ``failure``: the execution asks the same zygote again when no spare took it (its
        prepared spare had died, or a concurrent request took it; throwing the zygote away for it
        made concurrent runs fresh ones); otherwise the zygote is thrown away and the run goes on
        in fresh sandboxes, its code dir written anew outside the zygote's inbox."""
        if failure.unserved and self.unserved < UNSERVED_RETRIES:
            self.unserved += 1
            return
        discard(self.server, str(failure))
        self.server = None
        if self.code is not None:
            shutil.rmtree(self.code, ignore_errors=True)
        self.code = self._write_code_dir(None)

    def close(self) -> None:
        """The run is over: its code dir goes (off the caller's path when a zygote may still
        hold it open)."""
        code, self.code = self.code, None
        if code is None:
            return
        if self.server is not None:
            after_run(lambda: shutil.rmtree(code, ignore_errors=True))
        else:
            shutil.rmtree(code, ignore_errors=True)

    def launch(self, job: dict[str, Any], level: str, limits: RunLimits) -> "Launched":
        """Start one execution of ``job`` in the run's code dir: a zygote's child (raises
        :class:`UseFreshSandbox` if it cannot) or a fresh sandbox (raises :class:`CouldNotStart`)."""
        job["python_path"] = self.python_path
        privileged = os.geteuid() == 0
        job["uid"] = random.SystemRandom().randrange(2_000_000, 3_000_000) if privileged and level != "none" else None
        how: type[ForkedRun] | type[FreshRun] = FreshRun if self.server is None else ForkedRun
        return how.start(job, self.code, level, limits, self.server)


class Launched:
    """A started execution, however it was started: the harness's ends of its pipes
    (``result_fd``, ``stdout_fd``, ``job_fd``), its cgroup (whose live counters the monitor reads),
    the isolation it runs under, and how it is stopped and reaped (:class:`FreshRun`,
    :class:`ForkedRun`)."""

    forked: Execution | None = None  # the zygote's child, for a forked run

    def __init__(self, result_fd: int, stdout_fd: int, job_fd: int, group: RunGroup, level: str,
                 cpu_root: int | None = None) -> None:
        self.result_fd, self.stdout_fd, self.job_fd = result_fd, stdout_fd, job_fd
        self.group = group
        self.level = level  # as results record it
        # the run's first process, whose /proc tree is its CPU clock where no cgroup counts it
        self.cpu_root = cpu_root

    def stop(self, *, killed: bool, finished: bool, need_code: bool) -> tuple[int | None, float, GroupCounts, bool]:
        """Make sure no process of the run is left, and wait for its end: its exit code (None
        when none was reported), the CPU seconds its reaped processes used, its group's counters,
        and whether no spare of the zygote took it (its group is then only removed)."""
        raise NotImplementedError

    def abandon(self) -> None:
        """The harness failed while watching: kill and reap whatever runs."""
        self.end(killed=True, finished=False, by_itself=False, set_up=True, tail="")

    def end(self, *, killed: bool, finished: bool, by_itself: bool, set_up: bool, tail: str) -> Ended:
        """The execution's end, once its pipes are closed. ``killed``: the harness stopped it;
        ``finished``: it said it was done; ``by_itself``: it ended without its outcome (the exit
        code then words the message); ``set_up``: its isolation was complete (a forked child
        that was not is thrown away: :class:`UseFreshSandbox`, as is one whose zygote went away
        under it); ``tail``: its last output, for that message."""
        returncode, cpu_used, counts, unserved = self.stop(killed=killed, finished=finished, need_code=by_itself)
        # a forked run that ended without its outcome, and whose exit the zygote never reported: the
        # zygote went away under it (its runs die with it), so nothing says the program ended the run
        lost = returncode is None and by_itself
        # the CPU used and the limit counters only word the message of a run that did not finish
        ended = Ended(-signal.SIGKILL if returncode is None else returncode,
                      cpu_used if counts.cpu_seconds is None else max(cpu_used, counts.cpu_seconds),
                      counts.memory_hit, counts.processes_hit, counts.peak_memory_mb)
        # every process is dead or SIGKILLed: emptying the group can wait; the group of an execution
        # no spare took may hold another's spare moving out of it, and is only removed, never killed
        after_run(self.group.remove if unserved else self.group.close)
        if self.forked is not None and not set_up:
            # the fork server could not isolate this child (nothing of the candidate ran before
            # "ready"): it is thrown away and the execution runs in a fresh sandbox
            raise UseFreshSandbox(f"the fork server could not set up an execution (exit code {ended.returncode}): "
                                  f"{tail[-500:]}", unserved=unserved)
        if lost:
            # what ran is thrown away: the execution runs again, whole, in a fresh sandbox
            raise UseFreshSandbox("the fork server went away during an execution (it never reported the run's exit)")
        return ended


class FreshRun(Launched):
    """An execution in a fresh sandbox: bwrap (or, unsandboxed, a bare process group) started by
    the harness in a new cgroup."""

    def __init__(self, proc: subprocess.Popen, result_fd: int, group: RunGroup, level: str,
                 scratch: str | None) -> None:
        job_fd, stdout_fd = os.dup(proc.stdin.fileno()), os.dup(proc.stdout.fileno())
        proc.stdin.close()
        proc.stdout.close()
        super().__init__(result_fd, stdout_fd, job_fd, group, level, cpu_root=proc.pid)
        self.proc = proc
        self.scratch = scratch  # an unsandboxed run's host scratch dir, removed once it is reaped

    @classmethod
    def start(cls, job: dict[str, Any], code: Path, level: str, limits: RunLimits, server: None) -> "FreshRun":
        read_fd, write_fd = os.pipe()
        unsandboxed = level == "none"
        scratch = str(make_temp_dir("sbx-")) if unsandboxed else SCRATCH_DIR
        job.update(code=str(code) if unsandboxed else CODE_DIR, scratch=scratch)
        # -s -E would also drop PYTHONHASHSEED; the environment is built from scratch instead
        cmd = [sys.executable, *PYTHON_FLAGS, "-c", _CHILD_SOURCE, str(write_fd)]
        if not unsandboxed:
            allow = AllowList(code=code, scratch_mb=scratch_mb(limits))
            cmd = [*bwrap_argv(allow, privileged=os.geteuid() == 0), "--", *cmd]
        env = child_env(scratch)
        if unsandboxed:
            group = RunGroup("rlimit")
        else:
            group = RunGroup.create(memory_mb=limits.memory_mb, max_processes=limits.max_processes)
        level_name = level if unsandboxed else f"bwrap+{group.level}"
        try:
            proc = subprocess.Popen(group.attach_argv(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, pass_fds=(write_fd,), start_new_session=True,
                                    env=env, cwd=scratch if unsandboxed else "/")
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            group.close()
            raise CouldNotStart(f"sandbox could not start Python: {exc}", level_name) from exc
        os.close(write_fd)
        return cls(proc, read_fd, group, level_name, scratch if unsandboxed else None)

    def stop(self, *, killed: bool, finished: bool, need_code: bool) -> tuple[int | None, float, GroupCounts, bool]:
        # the one kill sequence, whatever happened: bwrap's PID namespace dies with it
        counts = self.group.ended(kill=True, finished=finished, leader=self.proc.pid)
        cpu = _reap(self.proc)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return self.proc.returncode, cpu, counts, False


class ForkedRun(Launched):
    """An execution forked by the zygote, in a cgroup of its own nested in the zygote's (a child
    that says it is isolated must be in it: the monitor checks, on the host)."""

    def __init__(self, execution: Execution, server: ForkServer) -> None:
        group = execution.group
        super().__init__(execution.result, execution.stdout, execution.stdin, group, f"bwrap+{group.level}")
        self.forked = execution
        self.server = server

    @classmethod
    def start(cls, job: dict[str, Any], code: Path, level: str, limits: RunLimits,
              server: ForkServer) -> "ForkedRun":
        job.update(code=CODE_DIR, scratch=SCRATCH_DIR)
        try:
            execution = server.start(code, child_env(SCRATCH_DIR), scratch_mb(limits), limits.memory_mb,
                                     limits.max_processes)
        except ForkServerDown as exc:
            raise UseFreshSandbox(str(exc)) from exc
        return cls(execution, server)

    def stop(self, *, killed: bool, finished: bool, need_code: bool) -> tuple[int | None, float, GroupCounts, bool]:
        # a run the harness stopped is killed through its group first, from here; one that ended
        # by itself only once the zygote reported its exit, which means every process of the run
        # has exited (see ForkServer.finish), and its group is then waited for until it is empty
        # (the wait is on the caller's path on purpose: no process of a run may still run, or
        # hold memory or files, when its result is returned)
        counts = self.group.ended(kill=True, finished=finished) if killed else None
        code, unserved = self.server.finish(self.forked, need_code=need_code)
        if counts is None:
            counts = self.group.ended(kill=not unserved, finished=finished)
        return code, 0.0, counts, unserved


def _reap(proc: subprocess.Popen) -> float:
    """Wait for ``proc``, record its exit code and return the CPU seconds it and its reaped
    descendants used."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


__all__ = ["CouldNotStart", "Ended", "ForkedRun", "FreshRun", "Launched", "Launcher", "UseFreshSandbox",
           "scratch_mb"]
