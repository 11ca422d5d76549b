"""``local-search``: the task family's own reference search (geometry or lockpicking)."""

from __future__ import annotations

from heldout.contracts import HeldoutError
from heldout.optimizers import geometry_search, lockpicking_search

CODE_FILES = ("geometry_search.py", "lockpicking_search.py", "merge.py")  # hashed with this file in run records


def supports_width(task_name: str) -> bool:
    """Whether ``width`` (the merged width search) exists for this task's family."""
    return task_name.split("/", 1)[0] == "lockpicking"


def optimize(view, seed: int, width: int | None = None, stream: int = 0):
    family = view.task_name.split("/", 1)[0]
    if family == "lockpicking":
        if width is not None:
            return lockpicking_search.optimize(view, seed, width=width, stream=stream)
        search = lockpicking_search.optimize
    elif family in ("circle_packing", "heilbronn"):
        if width is not None:
            raise HeldoutError("geometry-search has no width mode yet; use constant-search for a merge over literals")
        search = geometry_search.optimize
    else:
        raise HeldoutError(f"local-search has no search for {view.task_name}; use `reflective` for prompt tasks")
    return search(view, seed)
