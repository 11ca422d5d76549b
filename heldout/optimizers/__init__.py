"""Small reference optimizers so the suite runs end to end without an LLM.

Each is a callable ``optimize(view, seed) -> Candidate`` that touches the task only through the
:class:`~heldout.evaluators.session.TaskView` it is given. ``REFERENCE_OPTIMIZERS`` maps the names
``heldout run --optimizer NAME`` accepts to ``module:function`` paths."""

from __future__ import annotations

import importlib
from typing import Callable

from heldout.contracts import BudgetExceeded, HeldoutError

REFERENCE_OPTIMIZERS: dict[str, str] = {
    "seed": "heldout.optimizers.seed:optimize",
    "geometry-search": "heldout.optimizers.geometry_search:optimize",
    "lockpicking-search": "heldout.optimizers.lockpicking_search:optimize",
    "reflective": "heldout.optimizers.reflective:optimize",
    "local-search": "heldout.optimizers.local_search:optimize",
    # the real libraries, through heldout.adapters (extras [gepa], [dspy], [openevolve])
    "gepa": "heldout.optimizers.gepa:optimize",
    "dspy-mipro": "heldout.optimizers.dspy:optimize_mipro",
    "dspy-gepa": "heldout.optimizers.dspy:optimize_gepa",
    "openevolve": "heldout.optimizers.openevolve:optimize",
}


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


def resolve_optimizer(name: str) -> Callable:
    """A reference name or ``module:function``."""
    target = REFERENCE_OPTIMIZERS.get(name, name)
    if ":" not in target:
        raise HeldoutError(f"unknown optimizer {name!r}: use one of {', '.join(REFERENCE_OPTIMIZERS)} "
                           "or module:function")
    module, _, func = target.partition(":")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise HeldoutError(f"cannot load optimizer {target!r}: {exc}") from exc
