"""What heldout's reference searches share: a candidate's train score within the budget."""

from __future__ import annotations

from heldout.contracts import BudgetExceeded


def mean_train_score(view, candidate, ids) -> float | None:
    """The candidate's mean score on train ``ids``, or None when the budget cannot pay for it
    (the reference optimizers stop there rather than letting BudgetExceeded escape)."""
    if view.remaining < len(ids):
        return None
    try:
        results = view.evaluate(candidate, "train", ids)
    except BudgetExceeded:
        return None
    return sum(r["score"] for r in results) / len(results) if results else None
