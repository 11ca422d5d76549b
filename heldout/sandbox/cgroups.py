"""Whole-run resource limits through cgroups: memory (RAM + swap + tmpfs pages, summed over every
process of the run), process/thread count and CPU time of the run's whole process tree.

Per-process rlimits cannot bound a run that forks: ten children under a 300 MB address-space
limit hold 3 GB. A cgroup counts them together. Which controllers exist depends on the machine:

* ``cgroup-v2``: a unified hierarchy whose current group delegates ``memory`` and ``pids`` to
  its children (``cgroup.subtree_control``);
* ``cgroup-v1``: separate ``memory``, ``pids`` and ``cpuacct`` hierarchies (each under the
  harness's own group in that hierarchy, so the run's limits nest inside the harness's);
* ``rlimit``: neither is writable (not root, no delegation); only per-process rlimits apply, and
  the level is recorded as such in every result.

A :class:`RunGroup` is created per sandboxed run, the run's first process is moved into it
before it execs anything (:meth:`RunGroup.attach_argv`), and it is emptied and removed afterwards.
While the run goes on the harness reads its live counters where :class:`GroupFiles` says they are
(the monitor's clock); once it ended, :meth:`RunGroup.ended` kills what is left and reads its
final counts in one call.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from heldout.files import pid_is_running

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpuacct")
GROUP_PREFIX = "heldout-run-"
EXTRA_TASKS = 4  # bwrap, its pid-1 reaper and the shell that moves itself into the group


def _own_path(controller: str | None) -> str | None:
    """The harness's own group in ``controller``'s v1 hierarchy (None: the v2 hierarchy)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if controller is None and names == "":
            return path
        if controller is not None and controller in names.split(","):
            return path
    return None


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def _probe() -> tuple[str, dict[str, Path]]:
    """Where to create run groups, per controller; and the level name."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        own = _own_path(None)
        if own is not None:
            base = CGROUP_ROOT / own.lstrip("/")
            try:
                delegated = (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                delegated = []
            if {"memory", "pids"} <= set(delegated) and _writable_dir(base):
                return "cgroup-v2", {"unified": base}
    bases: dict[str, Path] = {}
    for controller in V1_CONTROLLERS:
        mount = CGROUP_ROOT / controller
        own = _own_path(controller)
        if own is None or not (mount / "cgroup.procs").exists():
            continue
        base = mount / own.lstrip("/")
        if _writable_dir(base):
            bases[controller] = base
    if "memory" in bases and "pids" in bases:
        return "cgroup-v1", bases
    return "rlimit", {}


_probe_lock = threading.Lock()
_probed: tuple[str, dict[str, Path]] | None = None


def _new_lock_after_fork() -> None:
    """A child forked while another thread held ``_probe_lock`` (an MBPP+ worker process, a
    process-pool worker) would wait on it for ever: the child gets a lock of its own."""
    global _probe_lock
    _probe_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


def limits_level() -> str:
    """``cgroup-v2``, ``cgroup-v1`` or ``rlimit`` (see the module docstring); probed once."""
    return _bases()[0]


def _bases() -> tuple[str, dict[str, Path]]:
    global _probed
    with _probe_lock:
        if _probed is None:
            _probed = _probe()
            _sweep_stale(_probed[1])
        return _probed


def _harness_alive(group: Path) -> bool:
    """Whether the harness that made ``group`` (its pid is in the name) still runs. Another
    harness's fresh group is empty until its first process moves in: it must not be swept then."""
    pid = group.name[len(GROUP_PREFIX):].split("-", 1)[0]
    if not pid.isdigit():
        return True  # not named by this scheme: leave it
    return pid_is_running(int(pid))


def _sweep_stale(bases: dict[str, Path]) -> None:
    """Remove empty run groups left by a harness that was killed (rmdir fails on busy ones). A
    fork server's group holds its executions' groups (cgroup v1): those go first, or the group
    itself could never be removed and every killed harness would leave its groups for good."""
    for base in bases.values():
        try:
            for child in base.glob(GROUP_PREFIX + "*"):
                if _harness_alive(child):
                    continue
                for group in (*_nested(child), child):
                    try:
                        group.rmdir()
                    except OSError:
                        pass
        except OSError:
            pass


@dataclass(frozen=True)
class GroupFiles:
    """Where a run group's live counters are, for the harness to read while the run goes on
    (:class:`heldout.sandbox.monitor.RunMeter`): each hierarchy's ``cgroup.procs``, the CPU counter
    (``cpu_key``: the name its value follows on the first line, or None for a bare number) in
    units of ``cpu_per_second``, the peak-memory counter, and the list of its threads. Empty for a
    group with no cgroup."""

    procs: tuple[str, ...] = ()
    cpu: str | None = None
    cpu_per_second: float = 1.0
    cpu_key: bytes | None = None
    peak: str | None = None
    threads: str | None = None  # the ids of every thread in the group, one a line

    @staticmethod
    def of(level: str, dirs: dict[str, Path]) -> "GroupFiles":
        procs = tuple(str(d / "cgroup.procs") for d in dirs.values())
        if level == "cgroup-v2" and "unified" in dirs:
            d = dirs["unified"]
            return GroupFiles(procs, str(d / "cpu.stat"), 1e6, b"usage_usec", str(d / "memory.peak"),
                              str(d / "cgroup.threads"))
        cpu = str(dirs["cpuacct"] / "cpuacct.usage") if "cpuacct" in dirs else None
        peak = str(dirs["memory"] / "memory.max_usage_in_bytes") if "memory" in dirs else None
        threads = str(next(iter(dirs.values())) / "tasks") if dirs else None
        return GroupFiles(procs, cpu, 1e9, None, peak, threads)


@dataclass(frozen=True)
class GroupCounts:
    """A run group's counters once its run ended (:meth:`RunGroup.ended`): its peak memory and,
    for a run that did not finish (they word its message), the CPU seconds it used and whether it
    hit its memory or process limit."""

    peak_memory_mb: float | None
    cpu_seconds: float | None = None
    memory_hit: bool = False
    processes_hit: bool = False


@dataclass
class RunGroup:
    """One run's cgroup(s). ``level`` is ``rlimit`` when none could be made (then every method is a
    no-op and the limits are per process only)."""

    level: str
    dirs: dict[str, Path] = field(default_factory=dict)
    holds_groups: bool = False  # groups were made inside it (a fork server's): they go with it
    files: GroupFiles = GroupFiles()  # its live counters, once it exists

    @classmethod
    def create(cls, *, memory_mb: int | None, max_processes: int | None,
               parent: "RunGroup | None" = None) -> "RunGroup":
        """A new group with these limits, under the harness's own group or (cgroup v1 only) inside
        ``parent`` (the fork server's group: its executions' groups nest in it). With both limits
        None the group has none of its own yet: :meth:`limit` sets them before the run starts."""
        level, bases = _bases()
        if parent is not None:
            if parent.level != "cgroup-v1" or not parent.dirs:
                return cls("rlimit")
            bases = dict(parent.dirs)
            parent.holds_groups = True  # before the group exists: a concurrent close must see it
        if level == "rlimit":
            return cls("rlimit")
        name = f"{GROUP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        group = cls(level)
        try:
            for controller, base in bases.items():
                path = base / name
                path.mkdir(mode=0o700)
                group.dirs[controller] = path
            group.files = GroupFiles.of(level, group.dirs)
            if memory_mb is not None or max_processes is not None:
                group.limit(memory_mb=memory_mb, max_processes=max_processes)
        except OSError:
            group.close()
            return cls("rlimit")
        return group

    def limit(self, *, memory_mb: int | None, max_processes: int | None) -> None:
        """Set the run's memory (RAM + swap) and process limits, once per group (None: leave that
        one unset). Raises OSError if the kernel refuses one."""
        if self.level == "rlimit":
            return
        if self.level == "cgroup-v2":
            d = self.dirs["unified"]
            if memory_mb is not None:
                _write(d / "memory.max", str(int(memory_mb) * 1024 * 1024))
                _try_write(d / "memory.swap.max", "0")
            if max_processes is not None:
                _write(d / "pids.max", str(int(max_processes) + EXTRA_TASKS))
            return
        if memory_mb is not None:
            memory = str(int(memory_mb) * 1024 * 1024)
            mem = self.dirs["memory"]
            _write(mem / "memory.limit_in_bytes", memory)
            _try_write(mem / "memory.memsw.limit_in_bytes", memory)  # no escape into swap
        if max_processes is not None:
            _write(self.dirs["pids"] / "pids.max", str(int(max_processes) + EXTRA_TASKS))

    def attach_argv(self, argv: list[str]) -> list[str]:
        """``argv`` prefixed by a shell that moves itself into the group and then execs ``argv``,
        so every process of the run is counted from its first instruction (exit 125 if the move
        fails: the parent reports a sandbox error, never the candidate's fault)."""
        if not self.dirs:
            return argv
        script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *self.files.procs, "--", *argv]

    def memory_exceeded(self) -> bool:
        """True if the run hit its memory limit (the kernel refused or reclaimed-then-killed)."""
        if self.level == "cgroup-v2":
            events = _read(self.dirs["unified"] / "memory.events")
            return _flat_value(events, "oom_kill") > 0 or _flat_value(events, "max") > 0
        if "memory" in self.dirs:
            return self.oom_kills() > 0 or _read_int(self.dirs["memory"] / "memory.failcnt") > 0
        return False

    def oom_kills(self) -> int:
        """How many processes of the run the kernel killed for the memory limit (0 without a
        memory controller, or on a v1 kernel that does not count kills)."""
        if self.level == "cgroup-v2":
            return _flat_value(_read(self.dirs["unified"] / "memory.events"), "oom_kill")
        if "memory" in self.dirs:
            return _flat_value(_read(self.dirs["memory"] / "memory.oom_control"), "oom_kill")
        return 0

    def processes_exceeded(self) -> bool:
        d = self.dirs.get("unified") or self.dirs.get("pids")
        return d is not None and _flat_value(_read(d / "pids.events"), "max") > 0

    def cpu_seconds(self) -> float | None:
        """CPU time used by every process of the run so far (None without a CPU controller)."""
        files = self.files
        if files.cpu is None:
            return None
        for line in _read(files.cpu).splitlines():
            fields = line.split()
            if files.cpu_key is None:
                return int(fields[0]) / files.cpu_per_second if fields and fields[0].isdigit() else None
            if len(fields) == 2 and fields[0] == files.cpu_key.decode() and fields[1].isdigit():
                return int(fields[1]) / files.cpu_per_second
        return None

    def peak_memory_mb(self) -> float | None:
        value = _read_int(self.files.peak) if self.files.peak is not None else None
        return round(value / (1024 * 1024), 1) if value else None

    def ended(self, *, kill: bool, finished: bool, leader: int | None = None) -> GroupCounts:
        """A run's end, in one call: with ``kill`` every process still in the group is killed and
        waited for (with ``leader``, the run's first process, the whole kill sequence:
        :meth:`kill_run`); then the group's counters (:class:`GroupCounts`)."""
        if kill and leader is not None:
            self.kill_run(leader)
        elif kill:
            self.kill_all(wait=True)
        if finished:
            return GroupCounts(self.peak_memory_mb())
        return GroupCounts(self.peak_memory_mb(), self.cpu_seconds(), self.memory_exceeded(),
                           self.processes_exceeded())

    def kill_run(self, pid: int) -> None:
        """Kill everything a run started: the group (every process, wherever it went), then the
        run's own process ``pid`` (bwrap: its PID namespace dies with it) and its process group.
        The one kill sequence: a fresh run's, a fork server's at its close, the isolated
        optimizer's. Leaves ``pid`` unreaped: os.kill, not Popen.kill(), whose poll could reap it
        before the caller's wait4."""
        self.kill_all()
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def kill_all(self, wait: bool = True) -> None:
        """SIGKILL every process still in the group, until it is empty (bounded); with
        ``wait=False`` once (the processes then die on their own time)."""
        deadline = time.monotonic() + 10.0
        pause = 0.0005  # killed processes are usually gone within a millisecond
        while self.dirs and time.monotonic() < deadline:
            pids = set()
            for member in self._members():
                pids |= {int(p) for p in _read(f"{member}/cgroup.procs").split() if p.isdigit()}
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if not wait:
                return
            time.sleep(pause)
            pause = min(2 * pause, 0.01)

    def _members(self) -> list[Path]:
        """The group's directories, each after the groups nested in it (if any were made)."""
        dirs = list(self.dirs.values())  # a snapshot: another thread may be closing the group
        if not self.holds_groups:
            return dirs
        return [n for d in dirs for n in (*_nested(d), d)]

    def close(self) -> None:
        """Kill what is left and remove the group's directories."""
        self.kill_all()
        self.remove()

    def remove(self) -> None:
        """Remove the group's directories once its processes left (each retried for a second: a
        group that stays busy is left to its parent group's :meth:`close`)."""
        for d in self._members():
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
        self.dirs.clear()


def _try_write(path: Path, value: str) -> None:
    try:
        _write(path, value)
    except OSError:
        pass


def _flat_value(text: str, key: str) -> int:
    """The number after ``key`` in a cgroup file of ``key value`` lines (0 when absent)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return 0


def _nested(group: Path) -> list[Path]:
    """The run groups inside ``group`` (a fork server's executions)."""
    try:
        # by name: only run groups' directories start with the prefix, never a control file
        return [group / name for name in os.listdir(group) if name.startswith(GROUP_PREFIX)]
    except OSError:
        return []


def _read(path: Path | str) -> str:
    # os.open/os.read: these small reads are on every execution's path, and a text file object
    # costs twice the syscalls' time (~21 vs ~10 us here)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks).decode("ascii", errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _write(path: Path, value: str) -> None:
    """Write ``value`` to a control file in one write (raises OSError if the kernel refuses it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode("ascii"))
    finally:
        os.close(fd)


def _read_int(path: Path | str) -> int:
    text = _read(path).strip()
    return int(text) if text.isdigit() else 0


__all__ = ["GroupCounts", "GroupFiles", "RunGroup", "limits_level"]
