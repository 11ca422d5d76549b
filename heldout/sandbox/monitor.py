"""Watching a started execution to its end: the harness's side of the job stream and the result
channel, and the limits the harness enforces itself while the run goes on.

:class:`Watch` feeds the job in (each call's input only when its clock starts: :class:`CallFeeder`)
and reads the result channel and the program's stdout until both close, the run says it is done
or fails, or a limit is hit; it then names that limit (``killed_for``):

* ``timeout``: the run's wall time (``limits.wall_seconds``, a backstop), not counting what the
  run waited for a CPU while other work ran (see :meth:`Watch._past_a_clock`);
* ``cpu``: the CPU time of the run's whole process tree, read from outside every
  :data:`CPU_CHECK_SECONDS` (the launcher's clock: the run's cgroup, or ``/proc``);
* ``call_timeout``: a call past its CPU limit or its wall backstop (:func:`wall_backstop`), as
  :class:`RunState` times each call from the channel's lines;
* ``output_too_large`` / ``stdout_too_large``: the result channel or stdout past its cap;
* ``fork_server``: a forked child said it was isolated but is not in its cgroup.

What the harness reads of the run while it goes on is :class:`RunMeter`'s: the CPU clock (the
run's cgroup counter, where :class:`~heldout.sandbox.cgroups.GroupFiles` says it is, or ``/proc``
under the run's first process) and whether a forked child joined its group. Memory and process
limits are the kernel's (the run's cgroup); the launcher reads their counters once the run has
ended. Nothing here starts, kills or reaps a process: :mod:`heldout.sandbox.launcher`
does, and :mod:`heldout.sandbox.process` turns a watch and its end into a result."""

from __future__ import annotations

import json
import math
import os
import queue
import select
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from heldout.contracts import RunLimits, wall_backstop
from heldout.sandbox.launcher import Launched

STDOUT_TAIL_BYTES = 4096
PARENT_SLACK_SECONDS = 0.5  # the child's own timer normally fires first; the parent's is the guarantee
CPU_CHECK_SECONDS = 0.25  # how often the parent reads a running execution's CPU time
CPU_SLACK_SECONDS = 0.5  # the whole run's CPU limit, as the parent enforces it
MAX_WAIT_CREDIT = 3.0  # at most this many times its limit is added to a run's wall clock for waits for a CPU
CORES = len(os.sched_getaffinity(0))  # the cores the runs share with the harness
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Watch:
    """One execution watched until it ends: :meth:`run` returns what was seen (:class:`Watched`),
    for the launcher's end of it and the verdict."""

    def __init__(self, started: Launched, job: dict[str, Any], encoded_calls: list[str], limits: RunLimits,
                 per_call: list[float | None], groups: list[str | None], inputs_up_front: bool) -> None:
        self.started = started
        self.limits = limits
        self.stdout_cap = max(limits.max_output_bytes, 64 * 1024)
        # the job goes through stdin: its header now, each call when its clock starts
        self.feeder = CallFeeder(started.job_fd, json.dumps(job).encode(), encoded_calls, inputs_up_front)
        self.meter = RunMeter(started.group.files, started.cpu_root)
        self.state = RunState(per_call, groups, job["stop_on_error"], typed=job["encoding"] == "typed",
                              on_call=self.feeder.send, cpu_clock=self.meter.cpu)
        self.killed_for: str | None = None
        self.deadline = math.inf  # the whole run's wall clock, from its start
        # the run's wait for a CPU given to its wall clocks so far, and the part the run's took
        self.waits_credited = self.run_waits_credited = 0.0
        self._stdout_tail = bytearray()
        self._stdout_total = self._result_total = 0

    def run(self) -> "Watched":
        """Read both streams until they close, the run says it is done or fails, or a limit is
        hit; then close the harness's ends of the pipes (a writer blocked on a full one fails)
        and say what was seen."""
        state, started = self.state, self.started
        self.deadline = time.monotonic() + self.limits.wall_seconds
        # poll, not a selector: two descriptors, read once a call (~4 us a call less)
        streams, result_fd = select.poll(), started.result_fd
        open_fds = {result_fd, started.stdout_fd}
        for fd in open_fds:
            streams.register(fd, select.POLLIN)
        next_cpu_check = time.monotonic() + CPU_CHECK_SECONDS  # at the start the run has used nothing
        try:
            while open_fds:
                now = time.monotonic()
                call_deadline = state.call_deadline()
                if now >= self.deadline or (call_deadline is not None and now >= call_deadline):
                    self.killed_for = self._past_a_clock(now)  # (it may move both clocks)
                    call_deadline = state.call_deadline()
                if self.killed_for is None and now >= next_cpu_check:
                    self.killed_for = self._over_cpu()
                    next_cpu_check = now + CPU_CHECK_SECONDS
                if self.killed_for is not None:
                    break
                wait = min(self.deadline, call_deadline or self.deadline, next_cpu_check) - now
                for fd, _ in streams.poll(1000 * max(0.0, min(wait, 0.5))):
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        streams.unregister(fd)
                        open_fds.discard(fd)
                    elif fd == result_fd:
                        self._result(chunk)
                    else:
                        self._stdout(chunk)
                if self.killed_for or state.done or state.fatal or state.bad:
                    break
            if state.done and not self.killed_for and started.stdout_fd in open_fds:
                # prints flushed before "done" may still sit in the pipe: keep what is already there
                self._stdout(_ready_bytes(started.stdout_fd, self.stdout_cap - self._stdout_total), late=True)
        finally:
            self.feeder.close()
            self.meter.close()
            os.close(started.result_fd)
            os.close(started.stdout_fd)
        return Watched(state, self.killed_for, self._stdout_tail.decode("utf-8", errors="replace"),
                       by_itself=not state.done and self.killed_for is None and not state.bad and state.fatal is None,
                       set_up=(state.ready or state.done) and self.killed_for != "fork_server",
                       waited_for_cpu=self.run_waits_credited)

    def _past_a_clock(self, now: float) -> str | None:
        """A wall clock ran out (the whole run's, or the call's backstop). They stop a program that
        waits, not one other work kept from a CPU: the wait no clock was given yet moves both first
        (the run's by at most :data:`MAX_WAIT_CREDIT` times its limit: it bounds the harness's wait)."""
        new = self._new_wait()
        self.state.move_call_clock(new)
        for_run = min(new, MAX_WAIT_CREDIT * self.limits.wall_seconds - self.run_waits_credited)
        if for_run > 0:
            self.deadline += for_run
            self.run_waits_credited += for_run
        if now >= self.deadline:
            return "timeout"
        call_deadline = self.state.call_deadline()
        if call_deadline is not None and now >= call_deadline:
            self.state.timed_out_by = "wall"
            return "call_timeout"
        return None

    def _new_wait(self) -> float:
        """Seconds the run waited for a CPU for other work and no clock got yet: its longest-waiting
        thread's run delay less the run's CPU time over the cores (threads that wait on each other
        wait on the program: a fork bomb gets nothing), less what was given before."""
        waited = self.meter.waited_for_cpu()
        owed = 0.0 if waited is None else waited - (self.meter.cpu() or 0.0) / CORES
        new, self.waits_credited = owed - self.waits_credited, max(owed, self.waits_credited)
        return new if new > 1e-3 else 0.0

    def _over_cpu(self) -> str | None:
        """The CPU clock, read from outside: the whole run's limit, and the running call's."""
        used = self.meter.cpu()
        if used is not None and used > self.limits.cpu_seconds + CPU_SLACK_SECONDS:
            return "cpu"
        if self.state.call_over_cpu(used):
            self.state.timed_out_by = "cpu"
            return "call_timeout"
        return None

    def _result(self, chunk: bytes) -> None:
        self._result_total += len(chunk)
        if self._result_total > self.limits.max_output_bytes:
            self.killed_for = "output_too_large"
            return
        was_ready = self.state.ready
        self.state.feed(chunk)
        # a child that says it is isolated must be in its cgroup (checked on the host)
        if self.started.forked is not None and self.state.ready and not was_ready and not self.meter.joined():
            # otherwise the fork server is not to be trusted with more runs
            self.killed_for = "fork_server"

    def _stdout(self, chunk: bytes, late: bool = False) -> None:
        self._stdout_total += len(chunk)
        self._stdout_tail += chunk
        del self._stdout_tail[:-STDOUT_TAIL_BYTES]
        if self._stdout_total > self.stdout_cap and not late:
            self.killed_for = "stdout_too_large"


@dataclass
class Watched:
    """What the monitor saw of one execution, for the launcher's end of it and the verdict:
    ``state`` (the channel's lines), ``killed_for`` (the limit the harness stopped it for, or
    None), the tail of its stdout, whether it ended ``by_itself`` without its outcome on the
    channel (the exit code then words the message), and whether it was ``set_up`` (the child's
    isolation was complete: it said so, in its cgroup, or it finished)."""

    state: "RunState"
    killed_for: str | None
    stdout_tail: str
    by_itself: bool
    set_up: bool
    waited_for_cpu: float = 0.0  # seconds the whole run's wall clock was moved for waits for a CPU


class RunMeter:
    """What the harness reads of a running execution from outside (the child's word counts for
    nothing here): the CPU seconds of its whole process tree, from its group's counter through a
    descriptor opened at the first reading and kept until :meth:`close` (one pread, ~2.5 us here,
    against ~19 us to open, read and close the file: it is read as every timed call ends), or,
    without one, from ``/proc`` under ``cpu_root``; and whether a forked child joined its group."""

    def __init__(self, files: Any, cpu_root: int | None) -> None:
        self.files = files  # the group's GroupFiles
        self.cpu_root = cpu_root
        self._fd: int | None = None

    def cpu(self) -> float | None:
        """The CPU seconds every process of the run used so far (None: no clock can tell)."""
        files = self.files
        if files.cpu is None:
            return _tree_cpu_seconds(self.cpu_root) if self.cpu_root is not None else None
        try:
            if self._fd is None:
                self._fd = os.open(files.cpu, os.O_RDONLY | os.O_CLOEXEC)
            fields = os.pread(self._fd, 4096, 0).split(b"\n", 1)[0].split()
        except OSError:
            return None
        if files.cpu_key is not None:  # "usage_usec N" is cgroup v2's first line
            fields = fields[1:] if fields[:1] == [files.cpu_key] else []
        return int(fields[0]) / files.cpu_per_second if fields and fields[0].isdigit() else None

    def waited_for_cpu(self) -> float | None:
        """The longest time one thread of the run has waited, runnable, for a CPU (the kernel's run
        delay, ``/proc/<tid>/schedstat``), in seconds; None where no group lists the threads."""
        if self.files.threads is None:
            return None
        # (a thread that exited meanwhile has no file: it reads empty)
        waits = (_read_bytes(f"/proc/{tid.decode()}/schedstat").split()[1:2] for tid in
                 _read_bytes(self.files.threads).split())
        return max((int(wait[0]) for wait in waits if wait), default=0) / 1e9

    def joined(self) -> bool:
        """Whether some process is or was in the run's group in every hierarchy that can tell: a
        member now, or CPU time and memory charged to the group (a fast run may have exited
        already, leaving no member, but its charges stay; v1's pids hierarchy keeps no such
        count)."""
        files = self.files
        if not files.procs:
            return False
        if all(_read_bytes(procs).split() for procs in files.procs):
            return True
        cpu = self.cpu()
        peak_text = b"" if files.peak is None else _read_bytes(files.peak).strip()
        peak = None if files.peak is None else int(peak_text) if peak_text.isdigit() else 0
        return (cpu is None or cpu > 0) and (peak is None or peak > 0) and (cpu, peak) != (None, None)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_bytes(path: str) -> bytes:
    """A small counter file's contents (empty when it cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return b""
    finally:
        os.close(fd)


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


class RunState:
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
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if self.buffer:
            lines[0] = bytes(self.buffer) + lines[0]
            self.buffer = bytearray()
        if rest:  # (the commonest chunk is whole lines, an outcome each: nothing is kept)
            self.buffer += rest
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

    def move_call_clock(self, seconds: float) -> None:
        """The running call's wall clock starts ``seconds`` later (time it waited for a CPU)."""
        if self.current is not None:
            self.current = (self.current[0], self.current[1] + seconds, self.current[2])

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


class CallFeeder:
    """Writes one execution's job stream: the header (the job without its calls) at once, then
    each call's input only when the parent starts that call's clock (:meth:`send`, from
    :class:`RunState`), so no input is in the candidate's process before its call, and work on an
    input is timed. Frames are ``<length>\n<bytes>``; ``send(None)`` or :meth:`close` ends the
    stream. With ``up_front`` (trusted code only: see :func:`heldout.sandbox.process.run_calls`)
    every call follows the header at once, then the end of the stream, and :meth:`send` has
    nothing left to do.

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


def _ready_bytes(fd: int, limit: int) -> bytes:
    """What can be read from ``fd`` without waiting, up to ``limit`` bytes (a program that keeps
    writing cannot hold the parent here: it stops at the limit)."""
    got = bytearray()
    readable = select.poll()  # not select(): the fd may be numbered above FD_SETSIZE
    readable.register(fd, select.POLLIN)
    while len(got) < limit and readable.poll(0):
        chunk = os.read(fd, min(65536, limit - len(got)))
        if not chunk:
            break
        got += chunk
    return bytes(got)


# -- the typed encoding ---------------------------------------------------------------------------------
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


__all__ = ["CallFeeder", "RunMeter", "RunState", "Watch", "Watched", "decode_typed"]
