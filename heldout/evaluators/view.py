"""The optimizer's side of a session: :class:`SessionView`, the in-process
:class:`heldout.contracts.TaskView`, and :class:`MeteredArchitect`, the architect model as the view
offers it. Both only forward to the session's :class:`~heldout.evaluators.evaluation.EvaluationService`,
which counts, checks and records; neither holds a test example."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from heldout.contracts import BudgetExceeded, Candidate, Example, HeldoutError, MetricSpec, VisibilityError, json_safe
from heldout.evaluators.evaluation import EvaluationService
from heldout.evaluators.policy import VERDICT_FIELDS, Budget
from heldout.models import ARCHITECT, ChatClient, ChatRequest, model_failure_kind


class MeteredArchitect:
    """The architect model as the optimizer sees it: every call is metered on the architect
    channel and recorded in the ledger. The token limit is checked before each call (a call's
    own size is unknown in advance, so the last call may cross the limit; it is recorded)."""

    def __init__(self, client: ChatClient | None, service: EvaluationService) -> None:
        self._client = client
        self._service = service

    @property
    def tokens_used(self) -> int:
        return self._service.usage.channel(ARCHITECT).tokens

    def complete(self, messages: Sequence[Mapping[str, str]], *, temperature: float = 1.0,
                 max_tokens: int | None = None, replicate: int = 0) -> str:
        if self._client is None:
            raise HeldoutError("this session has no architect model configured")
        self._service.check_running()
        request = ChatRequest(messages=tuple(dict(m) for m in messages), model=self._client.model,
                              temperature=temperature, max_tokens=max_tokens, replicate=replicate,
                              channel=ARCHITECT)
        recorded = self._service.replay_architect(request.cache_key())
        if recorded is not None:  # paid for (and allowed) before the interruption: same reply, counted once
            return recorded["text"]
        limit = self._service.budget.architect_tokens
        if limit is not None and self.tokens_used >= limit:
            raise BudgetExceeded(f"architect token budget of {limit} is used up")
        calls = self._service.budget.architect_calls
        if calls is not None and self._service.usage.channel(ARCHITECT).endpoint_calls >= calls:
            raise BudgetExceeded(f"architect call budget of {calls} is used up")
        self._service.check_wall_time()
        response = self._client.complete_many([request], return_exceptions=True)[0]
        if isinstance(response, BaseException):
            if model_failure_kind(response) != "model_refused":  # the endpoint's failure, not the request's
                self._service.stop_for_infrastructure(f"architect call failed: {response}", phase="optimisation",
                                                      channel=ARCHITECT)
            raise response
        self._service.usage.count_architect_call(response.prompt_tokens, response.completion_tokens)
        self._service.record_event("architect_call", {"prompt_tokens": response.prompt_tokens,
                                                      "completion_tokens": response.completion_tokens,
                                                      "cached": response.cached,
                                                      "request_key": response.request_key,
                                                      "text": response.text})
        return response.text



class SessionView:
    """The in-process implementation of :class:`heldout.contracts.TaskView`: the seed candidate,
    train examples (inputs + targets), val examples (inputs only), ``evaluate`` (verdicts filtered
    by the visibility policy and shown through the session's verifier variant), the task's
    ``metric`` (a shown ``score`` is its reading), the remaining budget, a metered architect and
    ``record_event``. Never test examples. The isolated client
    (:class:`heldout.adapters.client.TaskClient`) has the same names and raises the same errors."""

    __slots__ = ("task_name", "description", "kind", "seed_candidate", "train", "val", "policy",
                 "verifier", "metric", "_service", "_architect")

    def __init__(self, task_name: str, description: str, kind: str, seed: Candidate,
                 train: Sequence[Example], val: Sequence[Example], service: EvaluationService,
                 architect: MeteredArchitect, metric: MetricSpec) -> None:
        self.task_name = task_name
        self.description = description
        self.kind = kind
        self.seed_candidate = dict(seed)
        self.train = [{"id": ex.id, "input": ex.input, "target": ex.target} for ex in train]
        self.val = [{"id": ex.id, "input": ex.input} for ex in val]
        self.policy = service.policy.name
        self.verifier = service.variant.name
        self.metric = metric
        self._service = service
        self._architect = architect

    @property
    def remaining(self) -> int:
        return self._service.visible_remaining

    @property
    def metric_calls_budget(self) -> int:
        return self._service.budget.metric_calls

    @property
    def budget(self) -> Budget:
        return self._service.budget

    def evaluate(self, candidate: Candidate, split: str = "train", ids: Sequence[str] | None = None,
                 parent: str | None = None) -> list[dict[str, Any]]:
        """Score ``candidate`` on ``ids`` of ``split`` (all of it when None). Returns one dict per
        example with the fields the visibility policy allows; ``score`` is the metric's reading,
        so an invalid verdict of a cost shows its failure score, never the 0.0 that would be the
        best cost there is. Raises BudgetExceeded (nothing ran) or VisibilityError."""
        if type(split) is not str or split not in ("train", "val"):
            raise VisibilityError(f"split must be exactly 'train' or 'val', got {split!r}")
        allowed = self._service.policy.fields(split)
        out = []
        for example, verdict in self._service.evaluate(candidate, split, ids, parent):
            shown = {"id": example.id}
            full = {**verdict.to_dict(), "score": self.metric.reading(verdict), "target": example.target}
            shown.update({k: full[k] for k in VERDICT_FIELDS if k in allowed})
            # as plain JSON data, as an isolated optimizer receives it over HTTP: the same values in
            # both (an infinite distance ratio is "inf" in each, a tuple a list)
            out.append(json_safe(shown))
        return out

    def architect(self, messages: Sequence[Mapping[str, str]], *, temperature: float = 1.0,
                  max_tokens: int | None = None, replicate: int = 0) -> str:
        """One metered call of the session's architect model; returns its text."""
        return self._architect.complete(messages, temperature=temperature, max_tokens=max_tokens,
                                        replicate=replicate)

    @property
    def architect_tokens_used(self) -> int:
        return self._architect.tokens_used

    def record_event(self, kind: str, **data: Any) -> None:
        """Write mechanism evidence (``merge_attempt``, ``union_built`` ...) to the ledger; free."""
        self._service.record_optimizer_event(kind, data)
