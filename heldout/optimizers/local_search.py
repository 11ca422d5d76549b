"""``local-search``: the task family's own reference search (geometry or lockpicking)."""

from __future__ import annotations

from heldout.contracts import HeldoutError
from heldout.optimizers import geometry_search, lockpicking_search

CODE_FILES = ("geometry_search.py", "lockpicking_search.py", "merge.py")  # hashed with this file in run records


def supports_width(task_name: str) -> bool:
    """Whether ``width`` (the merged width search) exists for this task's family."""
    return task_name.split("/", 1)[0] == "lockpicking"


def minimum_budget(task: str, train: int, val: int, width: int | None = None, stream: int = 0) -> int:
    """A start and one move judged against it: on a lockpicking minibatch (all of train in the
    width search), on all of train for geometry. 0 where there is no search (the run refuses)."""
    family = task.split("/", 1)[0]
    if family == "lockpicking":
        return 2 * (train if width is not None else min(lockpicking_search.MINIBATCH, train))
    return 2 * train if family in ("circle_packing", "heilbronn") else 0


def optimize(view, seed: int, width: int | None = None, stream: int = 0):
    family = view.task_name.split("/", 1)[0]
    view.record_event("final_selection", split="train", how="moves kept on their train scores")
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
