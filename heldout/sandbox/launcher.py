"""How an execution starts and ends: forked by the fork server of the run's preload set
(:mod:`heldout.sandbox.zygote`) or in a fresh bubblewrap sandbox (:mod:`heldout.sandbox.root`),
each in a cgroup of its own (:mod:`heldout.sandbox.cgroups`). Every call into those three modules
that an execution makes is made here; :mod:`heldout.sandbox.monitor` watches what this module
started, and :mod:`heldout.sandbox.process` reads the outcome.

A :class:`Launcher` serves one ``run_calls``: it takes the zygote for the run (or none) and falls
back to fresh sandboxes when the zygote cannot serve it. Each execution it starts is a
:class:`Launched`: the harness's ends of its pipes, its group, its CPU clock, and :meth:`Launched.end`,
which kills what is left, reaps it and reads the group's limit counters into :class:`Ended`."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from heldout.contracts import RunLimits
from heldout.sandbox.cgroups import RunGroup
from heldout.sandbox.cleanup import after_run
from heldout.sandbox.root import (CODE_DIR, PYTHON_FLAGS, SCRATCH_DIR, AllowList, bwrap_argv, bwrap_probed, child_env,
                                  python_path)
from heldout.sandbox.zygote import (Execution, ForkServer, ForkServerDown, Preload, discard, fork_server_enabled,
                                    server_for, start_early)

DEFAULT_SCRATCH_MB = 64
UNSERVED_RETRIES = 8  # times an execution asks the fork server again when no spare took it
_CHILD_SOURCE = (Path(__file__).resolve().parent / "_child.py").read_text(encoding="utf-8")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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
        job["python_path"] = python_path()
        privileged = os.geteuid() == 0
        job["uid"] = random.SystemRandom().randrange(2_000_000, 3_000_000) if privileged and level != "none" else None
        how: type[ForkedRun] | type[FreshRun] = FreshRun if self.server is None else ForkedRun
        return how.start(job, self.code, level, limits, self.server)


class Launched:
    """A started execution, however it was started: the harness's ends of its pipes
    (``result_fd``, ``stdout_fd``, ``job_fd``), its cgroup, the isolation it runs under, and
    how it is killed, reaped and clocked (:class:`FreshRun`, :class:`ForkedRun`)."""

    forked: Execution | None = None  # the zygote's child, for a forked run

    def __init__(self, result_fd: int, stdout_fd: int, job_fd: int, group: RunGroup, level: str,
                 cpu: Callable[[], float | None]) -> None:
        self.result_fd, self.stdout_fd, self.job_fd = result_fd, stdout_fd, job_fd
        self.group = group
        self.level = level  # as results record it
        self.cpu = cpu  # the CPU seconds every process of the run used so far
        # a forked run's: whether its child joined its cgroup (see ForkedRun)
        self.in_its_group: Callable[[], bool] | None = None

    def kill(self) -> None:
        """Kill every process of the run."""
        raise NotImplementedError

    def reap(self, need_code: bool) -> tuple[int | None, float]:
        """Wait for the run's end: its exit code (None when none was reported) and CPU seconds."""
        raise NotImplementedError

    def abandon(self) -> None:
        """The harness failed while watching: kill and reap whatever runs."""
        self.kill()
        self.reap(False)

    def end(self, *, killed: bool, finished: bool, by_itself: bool, set_up: bool, tail: str) -> Ended:
        """The execution's end, once its pipes are closed. ``killed``: the harness stopped it;
        ``finished``: it said it was done; ``by_itself``: it ended without its outcome (the exit
        code then words the message); ``set_up``: its isolation was complete (a forked child
        that was not is thrown away: :class:`UseFreshSandbox`, as is one whose zygote went away
        under it); ``tail``: its last output, for that message."""
        # a forked run that ended by itself is killed by ``reap`` without waiting for its
        # cgroup to empty: the zygote's exit report already means its whole tree is gone
        if self.forked is None or killed:
            self.kill()
        returncode, cpu_used = self.reap(by_itself)
        # a forked run that ended without its outcome, and whose exit the zygote never reported: the
        # zygote went away under it (its runs die with it), so nothing says the program ended the run
        lost = returncode is None and by_itself
        # the CPU used and the limit counters only word the message of a run that did not finish
        group_cpu = None if finished else self.group.cpu_seconds()
        ended = Ended(-signal.SIGKILL if returncode is None else returncode,
                      cpu_used if group_cpu is None else max(cpu_used, group_cpu),
                      not finished and self.group.memory_exceeded(), not finished and self.group.processes_exceeded(),
                      self.group.peak_memory_mb())
        unserved = self.release_group()
        if self.forked is not None and not set_up:
            # the fork server could not isolate this child (nothing of the candidate ran before
            # "ready"): it is thrown away and the execution runs in a fresh sandbox
            raise UseFreshSandbox(f"the fork server could not set up an execution (exit code {ended.returncode}): "
                                  f"{tail[-500:]}", unserved=unserved)
        if lost:
            # what ran is thrown away: the execution runs again, whole, in a fresh sandbox
            raise UseFreshSandbox("the fork server went away during an execution (it never reported the run's exit)")
        return ended

    def release_group(self) -> bool:
        """Remove the execution's group; True when no spare of the zygote took the execution."""
        self.group.close()
        return False


class FreshRun(Launched):
    """An execution in a fresh sandbox: bwrap (or, unsandboxed, a bare process group) started by
    the harness in a new cgroup."""

    def __init__(self, proc: subprocess.Popen, result_fd: int, group: RunGroup, level: str,
                 scratch: str | None) -> None:
        job_fd, stdout_fd = os.dup(proc.stdin.fileno()), os.dup(proc.stdout.fileno())
        proc.stdin.close()
        proc.stdout.close()
        # without a CPU controller the run's processes are found under the one the harness started
        cpu = group.cpu_clock() if group.counts_cpu() else (lambda: _tree_cpu_seconds(proc.pid))
        super().__init__(result_fd, stdout_fd, job_fd, group, level, cpu)
        self.proc = proc
        self.scratch = scratch  # an unsandboxed run's host scratch dir, removed once it is reaped

    @classmethod
    def start(cls, job: dict[str, Any], code: Path, level: str, limits: RunLimits, server: None) -> "FreshRun":
        read_fd, write_fd = os.pipe()
        unsandboxed = level == "none"
        scratch = tempfile.mkdtemp(prefix="heldout-sbx-") if unsandboxed else SCRATCH_DIR
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

    def kill(self) -> None:
        self.group.kill_run(self.proc.pid)

    def reap(self, need_code: bool) -> tuple[int | None, float]:
        cpu = _reap(self.proc)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return self.proc.returncode, cpu


class ForkedRun(Launched):
    """An execution forked by the zygote, in a cgroup of its own nested in the zygote's."""

    def __init__(self, execution: Execution, server: ForkServer) -> None:
        group = execution.group
        super().__init__(execution.result, execution.stdout, execution.stdin, group, f"bwrap+{group.level}",
                         group.cpu_clock())
        self.forked = execution
        self.server = server
        # a child that says it is isolated must be in its cgroup (checked on the host; a fast run
        # may have exited already, so its charges count too): the group's own check, which the
        # monitor calls without coming back into this module
        self.in_its_group = group.was_joined

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

    def kill(self) -> None:
        self.server.kill(self.forked)

    def reap(self, need_code: bool) -> tuple[int | None, float]:
        # a run whose streams closed by themselves is exiting: it is killed only after its exit
        # was reported, which means every process of the run has exited (see wait_exit)
        # (the wait is on the caller's path on purpose: no process of a run may still run, or
        # hold memory or files, when its result is returned)
        if not need_code:
            self.server.end(self.forked)
        code = self.server.wait_exit(self.forked)
        if code is None:  # no report: whatever is left of the run is killed here, and waited for
            self.server.kill(self.forked, wait=True)
        self.server.finished(self.forked)
        return code, 0.0

    def release_group(self) -> bool:
        if self.server.unserved(self.forked):
            # what may be left in its group is a spare the zygote gave another request, which
            # moves it out: the group is only removed, never killed
            after_run(self.group.remove)
            return True
        after_run(self.group.close)  # every process is dead or SIGKILLed; emptying the group can wait
        return False


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


__all__ = ["CouldNotStart", "Ended", "ForkedRun", "FreshRun", "Launched", "Launcher", "UseFreshSandbox",
           "scratch_mb"]
