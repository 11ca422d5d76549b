"""What heldout's reference searches share: scores read in the metric's direction.

Every search maximises the *oriented* score ``view.metric.sign * score`` (the view's direction rule,
:class:`heldout.contracts.TaskView`), so one comparison ``>`` means "better" on an accuracy and on a
cost alike; no search negates a score by hand."""

from __future__ import annotations

from typing import Any, Sequence

from heldout.contracts import BudgetExceeded

ORIENTATION_EVENT = "score_orientation"


def oriented_mean(view, results: Sequence[dict[str, Any]]) -> float:
    """The mean shown score of ``results`` times the metric's sign (higher is better); 0.0 for none."""
    return view.metric.sign * sum(r["score"] for r in results) / len(results) if results else 0.0


def oriented_train_score(view, candidate, ids) -> float | None:
    """The candidate's oriented mean score on train ``ids``, or None when the budget cannot pay
    for it (the reference optimizers stop there rather than letting BudgetExceeded escape)."""
    if view.remaining < len(ids):
        return None
    try:
        results = view.evaluate(candidate, "train", ids)
    except BudgetExceeded:
        return None
    return oriented_mean(view, results) if results else None


def state_orientation(view, where: str) -> None:
    """Record, for a lower-is-better metric, that the scores ``where`` records are oriented
    (``sign * score``, so a cost appears negated); a higher-is-better metric's are its own scores."""
    metric = view.metric
    if not metric.higher_is_better:
        view.record_event(ORIENTATION_EVENT, metric=metric.name, higher_is_better=False, sign=metric.sign,
                          where=where, rule="scores recorded there are sign * score: the search maximises them, "
                          "so a lower cost is a higher recorded score")
