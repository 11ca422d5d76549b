"""Workers (the :class:`heldout.contracts.Worker` Protocol) that are not an HTTP endpoint."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from heldout.contracts import Completion, Message


class FunctionWorker:
    """A local Python function ``prompt text -> answer text`` standing in for a worker model (tests,
    offline experiments). The prompt is the messages' contents joined by blank lines."""

    def __init__(self, fn: Callable[[str], str], model: str = "local-function") -> None:
        self.fn = fn
        self.model = model

    def complete(self, messages: Sequence[Message]) -> Completion:
        started = time.perf_counter()
        text = self.fn("\n\n".join(m.content for m in messages))
        return Completion(text=str(text), seconds=time.perf_counter() - started)
