"""How many of the machine's cores a measured run kept busy, and whose they were.

A wall-time ratio against a reference can only fall as far as the cores allow: at 0 ms latency
the bare client and the loopback server already share the machine's cores, so work moved off the
client's core needs a core that is idle during the bare run. :class:`CoreMeter` reads, over one
run: this process's CPU (every thread) and its calling thread's, another process's CPU (the
server, every thread, dead ones included: the kernel's per-process CPU clock, in nanoseconds) and
the whole machine's busy time (``/proc/stat``, in clock ticks), each divided by the run's wall.
``others`` is what the machine was busy with beside the processes named (other users' work).
Linux only (the per-process clock and /proc); elsewhere the figures are None.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of process ``pid`` so far (every thread); None if it cannot be read."""
    try:  # the process-wide CPU clock of a pid: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
        return time.clock_gettime(((~pid) << 3) | 2)
    except (OSError, OverflowError, AttributeError):
        return None


def machine_busy_seconds() -> float | None:
    """Seconds of CPU the whole machine spent on anything but idle and I/O wait, summed over cores."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    guest = sum(fields[8:10])  # counted inside user and nice already
    return (sum(fields) - idle - guest) / TICKS


@dataclass
class Cores:
    """Cores busy over one run (CPU seconds / wall seconds): ``client`` (this process, every
    thread), ``client_caller`` (the thread that ran the measured code), ``server`` (the other
    process named), ``machine`` (everything), ``others`` (machine minus client and server)."""

    wall: float
    client: float
    client_caller: float
    server: float | None
    machine: float | None

    @property
    def ours(self) -> float:
        return self.client + (self.server or 0.0)

    def cpu_seconds(self) -> tuple[float, ...]:
        """(client, server) CPU seconds over the run, the server's only when it was read."""
        return (self.client * self.wall,) + (() if self.server is None else (self.server * self.wall,))

    @property
    def others(self) -> float | None:
        return None if self.machine is None else max(0.0, self.machine - self.ours)

    def describe(self) -> str:
        server = "?" if self.server is None else f"{self.server:.2f}"
        machine = "" if self.machine is None else f"; machine {self.machine:.2f} (others {self.others:.2f})"
        return (f"client {self.client:.2f} (its caller thread {self.client_caller:.2f}) + server {server} "
                f"= {self.ours:.2f}{machine}")


def cpu_bound_seconds(*process_cpu: float, ncpu: int | None = None) -> float:
    """The least wall a run's CPU work allows on an otherwise idle machine if each process can use
    at most one core (one interpreter lock; its fsync and system calls aside) and all of them
    ``ncpu`` cores: the busiest process's CPU, or all of it spread evenly, whichever is more.
    CPU seconds change little with other users' load, so this bound holds at any load."""
    return max(max(process_cpu), sum(process_cpu) / (ncpu or os.cpu_count() or 1))


def mean_cores(runs: list[Cores]) -> Cores:
    """Cores busy over several runs together: every CPU figure and wall summed, then divided."""
    wall = sum(r.wall for r in runs)
    total = lambda f: sum(getattr(r, f) * r.wall for r in runs) / wall  # noqa: E731
    server = None if any(r.server is None for r in runs) else total("server")
    machine = None if any(r.machine is None for r in runs) else total("machine")
    return Cores(wall / len(runs), total("client"), total("client_caller"), server, machine)


class CoreMeter:
    """``with CoreMeter(server_pid) as meter: ...`` then ``meter.cores`` (a :class:`Cores`)."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self.cores: Cores | None = None

    def _read(self) -> tuple:
        server = None if self.server_pid is None else process_cpu_seconds(self.server_pid)
        return (time.perf_counter(), time.process_time(), time.thread_time(), server, machine_busy_seconds())

    def __enter__(self) -> "CoreMeter":
        self._start = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._read()
        wall = end[0] - self._start[0]
        spent = [None if a is None or b is None else (b - a) / wall for a, b in zip(self._start[1:], end[1:])]
        self.cores = Cores(wall, spent[0], spent[1], spent[2], spent[3])
