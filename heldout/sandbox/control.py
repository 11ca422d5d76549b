"""The harness's side of talking to a zygote (:mod:`heldout.sandbox.zygote`): its control channel,
and the execution groups the harness stocks at it for its spares to join.

The channel is a ``SOCK_SEQPACKET`` socket: one JSON message per packet, requests out (with the
descriptors they pass), reports in (read by one thread of the server's). The stock: each
execution has a cgroup of its own, nested in the zygote's; a few are made in advance
(:data:`STOCKED_GROUPS`) and handed to the zygote, whose spares join them before any request
comes, so that making a group and joining it (a ``cgroup.procs`` write can wait ~10 ms for an RCU
grace period) are off the executions' path. A request then goes to a spare whose group was
taken here, with that group's limits set first."""

from __future__ import annotations

import array
import collections
import itertools
import json
import os
import socket
import threading
from typing import Any, Callable, Sequence

from heldout.sandbox.cgroups import RunGroup
from heldout.sandbox.cleanup import after_run

# execution groups made in advance, for the zygote's spares to join before a request comes: the
# four spares' groups and two queued, so that a refill right after a request still finds one
STOCKED_GROUPS = 6


class ControlChannel:
    """The harness's end of one zygote's control socket. Sends are serialised (executions start
    from many threads); :meth:`receive` is for the one thread that reads the reports."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        """One message, with ``fds`` passed along (the sender keeps and closes its own copies).
        Raises OSError when the zygote is not there to take it."""
        extra = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        with self._send_lock:
            self.sock.sendmsg([json.dumps(message).encode()], extra)

    def receive(self) -> dict[str, Any] | None:
        """The next report, or None once the zygote closed the channel (or wrote nonsense)."""
        try:
            data = self.sock.recv(1 << 16)
            message = json.loads(data) if data else None
        except (OSError, ValueError):
            return None
        return message if isinstance(message, dict) else None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class GroupStock:
    """The execution groups stocked at one zygote (by the id the zygote knows them by), and those
    of them a spare has joined. Thread-safe. ``accepting()`` says whether the zygote still takes
    work (no group is made for one that does not)."""

    def __init__(self, outer: RunGroup, channel: ControlChannel, accepting: Callable[[], bool]) -> None:
        self.outer = outer  # the zygote's own group: every execution's nests in it
        self.channel = channel
        self.accepting = accepting
        self._mutex = threading.Lock()  # guards the state below
        self._stock: dict[int, RunGroup] = {}  # handed to the zygote, by group id
        self._ready: collections.deque[int] = collections.deque()  # of those, joined by a spare
        self._making = 0
        self._ids = itertools.count(1)

    def refill(self) -> None:
        """Make groups and hand them to the zygote until :data:`STOCKED_GROUPS` are stocked."""
        while True:
            with self._mutex:
                if len(self._stock) + self._making >= STOCKED_GROUPS:
                    return
                self._making += 1
            try:
                if not self.accepting() or not self._stock_one():
                    return
            finally:
                with self._mutex:
                    self._making -= 1

    def _stock_one(self) -> bool:
        group = RunGroup.create(memory_mb=None, max_processes=None, parent=self.outer)
        if group.level == "rlimit":
            return False
        gid = next(self._ids)
        with self._mutex:
            self._stock[gid] = group  # before the zygote can name it
        fds = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in group.files.procs]
        try:
            self.channel.send({"stock": gid}, fds)
        except OSError:
            with self._mutex:
                self._stock.pop(gid, None)
            after_run(group.close)
            return False
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def on_report(self, message: dict[str, Any]) -> None:
        """A report of the zygote's about a stocked group: a spare joined it, or it is empty for
        good (its spare died, or moved to a request's own group: nothing is left in it to kill)."""
        gone = None
        with self._mutex:
            if type(message.get("spare")) is int and message["spare"] in self._stock:
                self._ready.append(message["spare"])
            elif type(message.get("group_gone")) is int:
                gone = self._stock.pop(message["group_gone"], None)
        if gone is not None:
            after_run(gone.remove)

    def dispatch(self, request: dict[str, Any], fds: Sequence[int], kept_fd: int, *, memory_mb: int,
                 max_processes: int) -> RunGroup | None:
        """Send the zygote ``request`` (with ``fds`` passed along, then ``kept_fd``, which the
        zygote keeps) in a group of its own with these limits: the group of a spare that joined
        it in advance, taken from the stock, its limits set before the request goes out; else a
        new group, which the request brings (its ``cgroup.procs`` files passed along) and the
        child joins. Returns the group (None: none could be made; nothing was sent). Raises
        OSError (its group closed) when the zygote is not there to take it."""
        gid, group = self.take_ready()
        if group is not None:
            try:
                group.limit(memory_mb=memory_mb, max_processes=max_processes)
            except OSError:
                # its spare stays there, unused, until the zygote hands it to a request that brings
                # its own group (it then moves out): the group is only removed, never killed
                after_run(group.remove)
                gid, group = None, None
        if group is None:
            group = RunGroup.create(memory_mb=memory_mb, max_processes=max_processes, parent=self.outer)
            if group.level == "rlimit":
                return None
        cgroup_fds = [] if gid is not None else [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in group.files.procs]
        try:
            self.channel.send({**request, "group": gid, "n_cgroup_fds": len(cgroup_fds)}, [*fds, *cgroup_fds, kept_fd])
        except OSError:
            group.close()
            raise
        finally:
            for fd in cgroup_fds:
                os.close(fd)
        return group

    def take_ready(self) -> tuple[int | None, RunGroup | None]:
        """A stocked group that a spare has joined (its id and the group), or (None, None)."""
        with self._mutex:
            while self._ready:
                gid = self._ready.popleft()
                group = self._stock.pop(gid, None)
                if group is not None:
                    return gid, group
        return None, None

    def spares_in_groups(self) -> int:
        """How many of the zygote's spares wait, ready, in a group of their own."""
        with self._mutex:
            return len(self._ready)

    def clear(self) -> None:
        """Forget every stocked group (they nest in the zygote's, and are removed with it)."""
        with self._mutex:
            self._stock.clear()
            self._ready.clear()


__all__ = ["ControlChannel", "GroupStock", "STOCKED_GROUPS"]
