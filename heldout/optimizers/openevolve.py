"""``openevolve``: OpenEvolve 0.4.0 itself, through :mod:`heldout.adapters.openevolve` (program
tasks; needs an architect model, OpenEvolve's LLM)."""

from __future__ import annotations

from heldout.adapters.openevolve import OpenEvolveSettings
from heldout.adapters.openevolve import optimize as run_openevolve
from heldout.contracts import Candidate, TaskView


def optimize(view: TaskView, seed: int) -> Candidate:
    return run_openevolve(view, seed, OpenEvolveSettings())
