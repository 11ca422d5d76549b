"""Where :func:`~heldout.benchmarks.mbpp_plus.execution.check_many`'s jobs run: a schedule of
worker threads (:class:`Schedule`), each of which may hand its sandboxed runs to a worker process
of its own (:class:`WorkerProcesses`).

Why worker processes (issue 60): a sandboxed check is a chain of wake-ups, one each way per
untrusted input (its clock starts when it is sent), between the thread that watches the run and
the run's child. Two such chains in one harness process share its interpreter lock, and the
scheduler scatters them over the cores; a wake-up across cores costs 50-120 us in this VM (an
idle virtual CPU halts) against ~9 us on one core. Measured on 30 problems at load 8-9: the whole
run confined to one core (``taskset -c 1``) took 1.0-1.35 s against 1.1-1.9 s on two; two
one-worker harnesses, each on a core of its own, finished 15 problems each in 0.86-1.17 s against
1.59-1.76 s for one two-worker harness on all 30. So each worker thread's runs go to a process of
its own (forked from the harness, trusted: it runs the same code), which keeps to one core with
its runs' children; the schedule, the expected outputs kept between checks and every verdict
stay in the harness. A worker process that dies fails the call as an infrastructure error, never
as a candidate's score."""

from __future__ import annotations

import ctypes
import gc
import heapq
import os
import pickle
import signal
import socket
import struct
import sys
import threading
from typing import Any, Callable

from heldout.contracts import DataError, HeldoutError
from heldout.files import remove_own_temp_dir
from heldout.sandbox.cleanup import drain_cleanup
from heldout.sandbox.zygote import shutdown as stop_fork_servers

_LENGTH = struct.Struct("!Q")
PR_SET_PDEATHSIG = 1


class Schedule:
    """Jobs run on ``workers`` threads, the ready job of the lowest rank first (ties: the first
    added), and a running job may add jobs. :meth:`run` returns when no job is left; if one
    raised, nothing new starts, the running ones finish and the first error is raised. With
    ``processes``, thread k runs its calls (:meth:`call`) in worker process k."""

    def __init__(self, workers: int, processes: "WorkerProcesses | None" = None, functions: Any = None) -> None:
        self.workers = max(1, workers)
        self.processes = processes
        self.functions = functions  # the module whose functions :meth:`call` names
        self.ready: list[tuple[tuple, int, Callable[[], None]]] = []
        self.running = 0
        self.added = 0
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self._mine = threading.local()  # the worker process of the calling thread, if any

    def add(self, rank: tuple, job: Callable[[], None]) -> None:
        with self.cond:
            heapq.heappush(self.ready, (rank, self.added, job))
            self.added += 1
            self.cond.notify()

    def call(self, name: str, *args: Any) -> Any:
        """The function ``name`` of the schedule's ``functions`` module on ``args``: in the calling
        worker thread's process when it has one (looked up there in its copy of the module, the
        same but for what changed after the fork), else here."""
        process = getattr(self._mine, "process", None)
        if process is None:
            return getattr(self.functions, name)(*args)
        return process.call(self.functions.__name__, name, args)

    def run(self) -> None:
        threads = [threading.Thread(target=self._work, args=(k,), daemon=True) for k in range(self.workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.error is not None:
            raise self.error

    def _work(self, k: int) -> None:
        if self.processes is not None:
            self._mine.process = self.processes.of(k)
        while True:
            with self.cond:
                while not self.ready and self.running and self.error is None:
                    self.cond.wait()
                if not self.ready or self.error is not None:
                    self.cond.notify_all()  # nothing left (or a job failed): the others end too
                    return
                _, _, job = heapq.heappop(self.ready)
                self.running += 1
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - raised by run(), in the caller's thread
                with self.cond:
                    self.error = self.error or exc
            finally:
                with self.cond:
                    self.running -= 1
                    self.cond.notify_all()


class WorkerProcesses:
    """``count`` worker processes forked now, worker k kept to core k (modulo the cores this
    process may use) with everything it starts; each runs one call at a time for the harness
    (:meth:`_Worker.call`) until :meth:`close`. Use as a context manager."""

    def __init__(self, count: int) -> None:
        cores = sorted(os.sched_getaffinity(0))
        sys.stdout.flush(), sys.stderr.flush()  # nothing buffered is written twice
        self.workers: list[_Worker] = []
        try:
            for k in range(count):
                self.workers.append(_Worker.fork(cores[k % len(cores)], self.workers))
        except BaseException:
            self.close()
            raise

    def of(self, k: int) -> "_Worker":
        return self.workers[k]

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self.workers = []

    def __enter__(self) -> "WorkerProcesses":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WorkerProcessFailed(HeldoutError):
    """A worker process died or could not answer: the harness's failure, not a candidate's."""


class _Worker:
    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock = pid, sock

    @staticmethod
    def fork(core: int, others: list["_Worker"]) -> "_Worker":
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the caller's frames
            code = 1
            try:
                # the harness killed: so is the worker (its fork servers die with it)
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                ours.close()
                for other in others:
                    other.sock.close()
                os.sched_setaffinity(0, {core})  # its runs' children keep to it too (inherited)
                gc.freeze()  # the harness's heap, copied: no full collection walks it while runs wait
                _serve(theirs)
                code = 0
            finally:
                try:
                    stop_fork_servers()
                    drain_cleanup()
                    remove_own_temp_dir()
                finally:
                    os._exit(code)
        theirs.close()
        return _Worker(pid, ours)

    def call(self, module: str, name: str, args: tuple) -> Any:
        try:
            _send(self.sock, (module, name, args))
            ok, value = _receive(self.sock)
        except (OSError, EOFError, pickle.PickleError) as exc:
            raise WorkerProcessFailed(f"an MBPP+ worker process failed: {exc!r}") from exc
        if ok:
            return value
        kind, message = value
        if kind == "DataError":
            raise DataError(message)
        raise WorkerProcessFailed(f"an MBPP+ worker process failed: {kind}: {message}")

    def close(self) -> None:
        if self.pid:
            self.sock.close()  # the worker's read ends: it stops its fork servers and exits
            os.waitpid(self.pid, 0)
            self.pid = 0


def _serve(sock: socket.socket) -> None:
    """The worker's loop: each call's function, by module and name, on its arguments; the
    result, or the error's kind and message, back. Ends when the harness closes its end."""
    while True:
        try:
            module, name, args = _receive(sock)
        except EOFError:
            return
        try:
            reply = (True, getattr(sys.modules[module], name)(*args))
        except Exception as exc:  # noqa: BLE001 - told to the harness, which raises it there
            reply = (False, (type(exc).__name__, str(exc)))
        _send(sock, reply)


def _send(sock: socket.socket, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LENGTH.pack(len(data)) + data)


def _receive(sock: socket.socket) -> Any:
    size = _LENGTH.unpack(_exactly(sock, _LENGTH.size))[0]
    return pickle.loads(_exactly(sock, size))


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise EOFError("the other end closed")
        data += chunk
    return bytes(data)
