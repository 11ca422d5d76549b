"""``local-search``: the task family's own reference search (geometry or lockpicking)."""

from __future__ import annotations

from heldout.benchmarks.base import HeldoutError


def optimize(view, seed: int):
    family = view.task_name.split("/", 1)[0]
    if family == "lockpicking":
        from heldout.optimizers.lockpicking_search import optimize as search
    elif family in ("circle_packing", "heilbronn"):
        from heldout.optimizers.geometry_search import optimize as search
    else:
        raise HeldoutError(f"local-search has no search for {view.task_name}; use `reflective` for prompt tasks")
    return search(view, seed)
