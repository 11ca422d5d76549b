"""Models that are not an HTTP endpoint."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from heldout.contracts import Completion, Message
from heldout.models.types import BatchError, ChatRequest, ChatResponse, ModelError


class FunctionWorker:
    """A local Python function ``prompt text -> answer text`` standing in for a model (offline
    experiments, tests). It drives a session, as a :class:`heldout.models.ChatClient`
    (``Session(..., models=SessionModels(worker=FunctionWorker(fn)))``), and answers a task
    directly, as a :class:`heldout.contracts.Worker` (``benchmark.context(worker=...)``).

    The prompt is a completion's text, or a chat's message contents joined by blank lines. The
    function is the endpoint: each answer counts as one endpoint call and no tokens (it reports
    none). A function that raises answers that request with a :class:`ModelError`
    (``bad_response``), as an endpoint that failed would."""

    def __init__(self, fn: Callable[[str], str], model: str = "local-function") -> None:
        self.fn = fn
        self.model = model

    def complete(self, messages: Sequence[Message]) -> Completion:
        started = time.perf_counter()
        try:
            text = self.fn("\n\n".join(m.content for m in messages))
        except Exception as exc:  # as complete_many: the function's failure is the model's
            raise ModelError(f"function model {self.model!r} raised {type(exc).__name__}: {exc}",
                             kind="bad_response") from exc
        return Completion(text=str(text), seconds=time.perf_counter() - started)

    def complete_many(self, requests: Sequence[ChatRequest], *,
                      return_exceptions: bool = False) -> list[ChatResponse | ModelError]:
        results = [self._answer(request) for request in requests]
        if not return_exceptions and any(isinstance(r, ModelError) for r in results):
            raise BatchError(results)
        return results

    def _answer(self, request: ChatRequest) -> ChatResponse | ModelError:
        prompt = request.prompt if request.is_completion else "\n\n".join(m["content"] for m in request.messages)
        started = time.perf_counter()
        try:
            text = self.fn(prompt)
        except Exception as exc:  # the function is this model's endpoint: its failure is the model's
            return ModelError(f"function model {self.model!r} raised {type(exc).__name__}: {exc}",
                              kind="bad_response", request_key=request.cache_key())
        return ChatResponse(text=str(text), prompt_tokens=0, completion_tokens=0, cached=False,
                            seconds=time.perf_counter() - started, request_key=request.cache_key())
