"""``local-search``: the task family's own reference search (geometry or lockpicking)."""

from __future__ import annotations

from heldout.contracts import HeldoutError
from heldout.optimizers import geometry_search, lockpicking_search

CODE_FILES = ("geometry_search.py", "lockpicking_search.py")  # hashed with this file in run records


def optimize(view, seed: int):
    family = view.task_name.split("/", 1)[0]
    if family == "lockpicking":
        search = lockpicking_search.optimize
    elif family in ("circle_packing", "heilbronn"):
        search = geometry_search.optimize
    else:
        raise HeldoutError(f"local-search has no search for {view.task_name}; use `reflective` for prompt tasks")
    return search(view, seed)
