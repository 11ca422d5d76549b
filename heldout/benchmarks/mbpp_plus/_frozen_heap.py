"""The objects a process held before a check keep out of the garbage collector's full passes
while the check runs.

A full collection walks every tracked object of the process while holding the interpreter lock,
so every monitoring thread stops and every sandboxed solution waits for its next input meanwhile.
A check makes enough long-lived objects (expected outputs, outcomes) to set one off, depending on
what the process allocated before: in perf/mbpp_plus_run.py's runner (numpy imported, MBPP+
loaded) one walks ~51,000 objects, ~20 ms of CPU, and took 67-167 ms of wall inside a 30-problem
check at a load of 6 (its thread preempted with the lock held; ``gc.callbacks``, issue 60), against
about 1 ms for the check's young collections. :func:`older_objects_frozen` moves what
exists at the start into the permanent generation (``gc.freeze``) and back at the end
(``gc.unfreeze``): objects made during the check are collected as usual, older cyclic garbage
waits until the end. Nested and concurrent checks share one freeze; a process that froze objects
itself is left as it is."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from typing import Iterator

_lock = threading.Lock()
_holders = 0  # checks running inside the freeze this module made (0: it made none)


def _new_lock_after_fork() -> None:
    """A child forked while another thread held ``_lock`` (an MBPP+ worker process, a
    process-pool worker) would wait on it for ever: the child gets a lock of its own."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


@contextlib.contextmanager
def older_objects_frozen() -> Iterator[None]:
    global _holders
    with _lock:
        ours = _holders > 0 or gc.get_freeze_count() == 0  # a freeze of the caller's own stays its own
        if ours:
            if _holders == 0:
                gc.freeze()
            _holders += 1
    try:
        yield
    finally:
        if ours:
            with _lock:
                _holders -= 1
                if _holders == 0:
                    gc.unfreeze()


__all__ = ["older_objects_frozen"]
