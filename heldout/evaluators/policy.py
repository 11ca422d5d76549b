"""What an optimizer may spend and see: the session's :class:`Budget` and the
:class:`VisibilityPolicy` that filters every verdict it is shown, per split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from heldout.contracts import VisibilityError


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
