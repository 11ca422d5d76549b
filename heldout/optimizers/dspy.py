"""``dspy-mipro`` and ``dspy-gepa``: DSPy 3.4.1's MIPROv2 (zero-shot, sized to the budget) and
dspy.GEPA, through :mod:`heldout.adapters.dspy` (prompt tasks; need an architect model, DSPy's
prompt / reflection LM)."""

from __future__ import annotations

from heldout.adapters.dspy import DSPyGEPASettings, MIPROSettings, optimize_gepa as run_gepa
from heldout.adapters.dspy import optimize_mipro as run_mipro
from heldout.contracts import Candidate, TaskView


def optimize_mipro(view: TaskView, seed: int) -> Candidate:
    return run_mipro(view, seed, MIPROSettings())


def optimize_gepa(view: TaskView, seed: int) -> Candidate:
    return run_gepa(view, seed, DSPyGEPASettings())
