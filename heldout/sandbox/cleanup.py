"""Work that follows an execution off the caller's path: removing its cgroup or code dir,
closing a retired fork server, restocking a zygote's groups. One background thread per process
runs the tasks in order, so that a caller does not wait for the kernel to finish tearing down the
processes it killed."""

from __future__ import annotations

import os
import queue
import threading
from typing import Callable

_lock = threading.Lock()
_tasks: "queue.SimpleQueue[Callable[[], None]]" = queue.SimpleQueue()
_thread: threading.Thread | None = None


def after_run(task: Callable[[], None]) -> None:
    """Run ``task`` on the cleanup thread (started on first use)."""
    global _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_clean, name="heldout-sandbox-cleanup", daemon=True)
            _thread.start()
    _tasks.put(task)


def _clean() -> None:
    while True:
        task = _tasks.get()
        try:
            task()
        except Exception:  # noqa: BLE001 - a leftover dir is swept by the next harness
            pass


def drain_cleanup(timeout: float = 30.0) -> None:
    """Wait until every queued task ran (tests and exit)."""
    done = threading.Event()
    after_run(done.set)
    done.wait(timeout)


def _forget_after_fork() -> None:
    """In a forked child (a process-pool worker) the parent's thread was not copied: the child
    queues its own tasks for a thread of its own."""
    global _lock, _tasks, _thread
    _lock = threading.Lock()
    _tasks = queue.SimpleQueue()
    _thread = None


os.register_at_fork(after_in_child=_forget_after_fork)

__all__ = ["after_run", "drain_cleanup"]
