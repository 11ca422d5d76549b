"""``seed``: return the seed candidate unchanged (the unoptimised baseline every table needs)."""

from __future__ import annotations


def optimize(view, seed: int):
    view.record_event("final_selection", split="none", how="the seed candidate, unselected")
    return dict(view.seed_candidate)


def minimum_budget(task: str, train: int, val: int) -> int:
    """The baseline spends nothing, by design."""
    return 0
