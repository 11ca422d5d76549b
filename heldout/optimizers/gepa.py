"""``gepa``: GEPA 0.1.4 itself, through :mod:`heldout.adapters.gepa` (prompt tasks; needs an
architect model, which GEPA uses as its reflection LM)."""

from __future__ import annotations

from heldout.adapters.gepa import GEPASettings
from heldout.adapters.gepa import optimize as run_gepa
from heldout.contracts import Candidate, TaskView


def optimize(view: TaskView, seed: int) -> Candidate:
    return run_gepa(view, seed, GEPASettings())
