"""Several copies of one backend answering requests in parallel (``serve-model --slots N``).

A llama.cpp context holds one request's state, so one backend answers one request at a time. A
small model on one thread leaves the other core idle; a second copy (a second context over the
same memory-mapped weights) answers a second request meanwhile. Each request takes a free copy,
waiting while all are busy, and gives it back when its answer is done (streamed or not) or its
client has gone (a request whose client left while it waited never takes a copy).

The rule that keeps answers reproducible: the copies are built alike (same model file, same
settings) and every request starts from a reset state with its own seed, so which copy answers
never changes the text."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Sequence

from heldout.models.server import Backend, ChatCall, Completion

WAIT_CHECK_SECONDS = 0.25  # how often a request waiting for a copy asks whether it is still wanted


class SlotPool:
    """``backends``: one or more copies of the same model; requests are spread over them. Safe to
    call from the server's threads. ``model_id`` and ``serves`` are the first copy's;
    ``answered[i]`` counts the requests copy ``i`` finished (refusals and failures included)."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        if not backends:
            raise ValueError("a slot pool needs at least one backend")
        names = {backend.model_id for backend in backends}
        if len(names) != 1:
            raise ValueError(f"the slots of one pool must serve one model; got {sorted(names)}")
        self.copies = tuple(backends)
        self.model_id = self.copies[0].model_id
        self.answered = [0] * len(self.copies)
        self._count = threading.Lock()
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(len(self.copies)):
            self._free.put(slot)

    @property
    def slots(self) -> int:
        return len(self.copies)

    def reported_model(self, requested: str) -> str:
        return self.copies[0].reported_model(requested)

    def serves(self, requested: str) -> bool:
        serves = getattr(self.copies[0], "serves", None)
        return True if serves is None else bool(serves(requested))

    def check(self, call: ChatCall) -> None:
        """The copies' refusals that need no model (see the server's ``check``)."""
        check = getattr(self.copies[0], "check", None)
        if check is not None:
            check(call)

    def complete(self, call: ChatCall, on_text: Callable[[str], None] | None = None) -> Completion:
        while True:
            try:
                slot = self._free.get(timeout=WAIT_CHECK_SECONDS)
                break
            except queue.Empty:
                if on_text is not None:
                    on_text("")  # raises when the client has gone: it leaves the queue
        try:
            return self.copies[slot].complete(call, on_text)
        finally:
            with self._count:
                self.answered[slot] += 1
            self._free.put(slot)
