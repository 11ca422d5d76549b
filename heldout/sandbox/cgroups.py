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
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

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
    """Remove empty run groups left by a harness that was killed (rmdir fails on busy ones)."""
    for base in bases.values():
        try:
            for child in base.glob(GROUP_PREFIX + "*"):
                if _harness_alive(child):
                    continue
                try:
                    child.rmdir()
                except OSError:
                    pass
        except OSError:
            pass


@dataclass
class RunGroup:
    """One run's cgroup(s). ``level`` is ``rlimit`` when none could be made (then every method is a
    no-op and the limits are per process only)."""

    level: str
    dirs: dict[str, Path] = field(default_factory=dict)
    holds_groups: bool = False  # groups were made inside it (a fork server's): they go with it
    _clock_fd: int | None = None  # the CPU counter, kept open by cpu_clock()

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

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the run's first process must write its pid to."""
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def attach_argv(self, argv: list[str]) -> list[str]:
        """``argv`` prefixed by a shell that moves itself into the group and then execs ``argv``,
        so every process of the run is counted from its first instruction (exit 125 if the move
        fails: the parent reports a sandbox error, never the candidate's fault)."""
        if not self.dirs:
            return argv
        script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *self.procs_files(), "--", *argv]

    def has_members(self) -> bool:
        """True if some process is in the group (in every controller's hierarchy)."""
        return bool(self.dirs) and all(_read(f"{d}/cgroup.procs").split() for d in self.dirs.values())

    def was_joined(self) -> bool:
        """True if some process is or was in the group in every hierarchy that can tell: a member
        now, or CPU time and memory charged to the group (a run that already exited leaves no
        member, but its charges stay; v1's pids hierarchy keeps no such count)."""
        if self.has_members():
            return True
        if not self.dirs:
            return False
        cpu, peak = self.cpu_seconds(), self._peak_bytes()
        return (cpu is None or cpu > 0) and (peak is None or peak > 0) and (cpu, peak) != (None, None)

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

    def _cpu_counter(self) -> tuple[Path, float] | None:
        """The file that counts the run's CPU time and its units per second (None without a CPU
        controller): cgroup v2's ``cpu.stat`` (``usage_usec``), v1's ``cpuacct.usage`` (ns)."""
        if self.level == "cgroup-v2":
            return self.dirs["unified"] / "cpu.stat", 1e6
        if "cpuacct" in self.dirs:
            return self.dirs["cpuacct"] / "cpuacct.usage", 1e9
        return None

    def counts_cpu(self) -> bool:
        """Whether :meth:`cpu_seconds` can tell the run's CPU time."""
        return self._cpu_counter() is not None

    def cpu_seconds(self) -> float | None:
        """CPU time used by every process of the run so far (None without a CPU controller)."""
        counter = self._cpu_counter()
        if counter is None:
            return None
        path, scale = counter
        if self.level == "cgroup-v2":
            for line in _read(path).splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / scale
            return None
        return _read_int(path) / scale

    def cpu_clock(self) -> Callable[[], float | None]:
        """:meth:`cpu_seconds` as a function that reads the counter through a descriptor opened at
        its first reading and kept until the group is removed: one pread (~2.5 us here, against
        ~19 us to open, read and close the file), since the parent reads it as every timed call
        ends."""
        counter = self._cpu_counter()
        if counter is None:
            return self.cpu_seconds
        (path, scale), v2 = counter, self.level == "cgroup-v2"

        def read() -> float | None:
            try:
                if self._clock_fd is None:
                    self._clock_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                text = os.pread(self._clock_fd, 4096, 0)
            except OSError:
                return self.cpu_seconds()
            if v2:  # "usage_usec N" is the first line
                first = text.split(b"\n", 1)[0].split()
                return int(first[1]) / scale if first[:1] == [b"usage_usec"] else self.cpu_seconds()
            return int(text) / scale if text.strip().isdigit() else None

        return read

    def peak_memory_mb(self) -> float | None:
        value = self._peak_bytes()
        return round(value / (1024 * 1024), 1) if value else None

    def _peak_bytes(self) -> int | None:
        if self.level == "cgroup-v2":
            return _read_int(self.dirs["unified"] / "memory.peak")
        if "memory" in self.dirs:
            return _read_int(self.dirs["memory"] / "memory.max_usage_in_bytes")
        return None

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
        if self._clock_fd is not None:
            os.close(self._clock_fd)
            self._clock_fd = None
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


def _read_int(path: Path) -> int:
    text = _read(path).strip()
    return int(text) if text.isdigit() else 0


__all__ = ["RunGroup", "limits_level"]
