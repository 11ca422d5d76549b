"""What an optimizer may spend and see: the session's :class:`Budget`, the :class:`Usage` it is
enforced against (what the session has spent), and the :class:`VisibilityPolicy` that filters
every verdict it is shown, per split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from heldout.contracts import VisibilityError
from heldout.models import ARCHITECT, UsageMeter


@dataclass(frozen=True)
class Budget:
    """Limits of one session. ``metric_calls`` is the unit matched across methods by default;
    a protocol may match ``architect_calls`` or ``architect_tokens`` instead (both enforced)."""

    metric_calls: int
    architect_tokens: int | None = None
    wall_seconds: float | None = None
    architect_calls: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.metric_calls, int) or self.metric_calls < 0:
            raise ValueError(f"metric_calls must be a non-negative int, got {self.metric_calls!r}")


VERDICT_FIELDS = ("score", "valid", "dimensions", "feedback", "error", "error_kind", "output", "target")


@dataclass(frozen=True)
class VisibilityPolicy:
    """Which verdict fields the optimizer sees, per split. An empty set refuses the split.

    ``standard``: train shows everything (score, feedback, dimensions, target); val shows the
    score only; test is refused (scored once by the harness after the optimizer returns)."""

    name: str = "standard"
    train: frozenset[str] = frozenset(VERDICT_FIELDS)
    val: frozenset[str] = frozenset({"score"})
    test: frozenset[str] = frozenset()

    def fields(self, split: str) -> frozenset[str]:
        allowed = getattr(self, split, None) if split in ("train", "val", "test") else None
        if not allowed:
            raise VisibilityError(f"split {split!r} is not visible to the optimizer under the "
                                  f"{self.name!r} policy")
        return allowed

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **{s: sorted(getattr(self, s)) for s in ("train", "val", "test")}}


STANDARD_POLICY = VisibilityPolicy()
# For leakage experiments only: val behaves like train. Reports state the policy.
LEAKY_VAL_POLICY = VisibilityPolicy(name="leaky-val", val=frozenset(VERDICT_FIELDS))
POLICIES = {p.name: p for p in (STANDARD_POLICY, LEAKY_VAL_POLICY)}


class Usage(UsageMeter):
    """A session's meter: its worker and architect calls per channel, counted as every
    :class:`UsageMeter` counts them, plus the metric calls the budget is enforced against and the
    evaluations replayed from a resumed ledger. The run record's usage fields are views of the
    channels: ``endpoint_calls`` and ``tokens`` of each channel that made an endpoint call, and
    ``cache_hits``, the answers served without one (a response cache, a replay, the session's memo).

    ``metric_calls`` is read-only: it grows only through :meth:`charge` (an in-process optimizer
    that assigns to it by accident gets an ``AttributeError``, not more budget)."""

    def __init__(self) -> None:
        super().__init__()
        self._metric_calls = 0
        self.replayed = 0

    @property
    def metric_calls(self) -> int:
        return self._metric_calls

    def charge(self, calls: int) -> None:
        """Count ``calls`` (>= 0) more metric calls."""
        if calls < 0:
            raise ValueError(f"metric calls are only ever added, got {calls}")
        with self._lock:
            self._metric_calls += int(calls)

    def count_architect_call(self, prompt_tokens: int, completion_tokens: int) -> None:
        """An architect call counts its tokens and one call whether or not the endpoint answered it
        (a cached reply costs the same), so the architect budget binds every method alike."""
        self.add(ARCHITECT, endpoint_calls=1, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)

    @property
    def endpoint_calls(self) -> dict[str, int]:
        return {name: u.endpoint_calls for name, u in self.channels().items() if u.endpoint_calls}

    @property
    def tokens(self) -> dict[str, dict[str, int]]:
        return {name: {"prompt": u.prompt_tokens, "completion": u.completion_tokens}
                for name, u in self.channels().items() if u.endpoint_calls}

    @property
    def cache_hits(self) -> int:
        return sum(u.cache_hits + u.replay_hits for u in self.channels().values())
