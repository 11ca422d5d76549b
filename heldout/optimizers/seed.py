"""``seed``: return the seed candidate unchanged (the unoptimised baseline every table needs)."""

from __future__ import annotations


def optimize(view, seed: int):
    return dict(view.seed_candidate)
