"""``dspy-mipro`` and ``dspy-gepa``: DSPy 3.4.1's MIPROv2 (instructions and few-shot demos, as DSPy
runs it by default; ``zero_shot=true`` for instructions only; trials sized to the budget) and
dspy.GEPA, through :mod:`heldout.adapters.dspy` (prompt tasks; need an architect model, DSPy's
prompt / reflection LM).

``program=MODULE:FACTORY`` (``--optimizer dspy-mipro?program=my_program:build``) optimises the
user's own ``dspy.Module``, ``FACTORY()``, instead of heldout's one-``Predict`` program; that
module is user code, so the run is isolated unless ``--trusted-optimizer``. The other options are
the fields of :class:`~heldout.adapters.settings.MIPROSettings` and
:class:`~heldout.adapters.settings.DSPyGEPASettings` (``--method-option dspy-mipro.auto=light``)."""

from __future__ import annotations

from typing import Any

from heldout.adapters.dspy import optimize_gepa as run_gepa
from heldout.adapters.dspy import optimize_mipro as run_mipro
from heldout.adapters.settings import DSPyGEPASettings, MIPROSettings, make_settings
from heldout.contracts import Candidate, TaskView
from heldout.optimizers.loading import load_function


def optimize_mipro(view: TaskView, seed: int, program: str | None = None, **settings: Any) -> Candidate:
    factory = load_function(program, "DSPy program factory") if program else None
    return run_mipro(view, seed, make_settings(MIPROSettings, settings), program=factory)


def optimize_gepa(view: TaskView, seed: int, program: str | None = None, **settings: Any) -> Candidate:
    factory = load_function(program, "DSPy program factory") if program else None
    return run_gepa(view, seed, make_settings(DSPyGEPASettings, settings), program=factory)


def minimum_budget_mipro(task: str, train: int, val: int, program: str | None = None, **settings: Any) -> int:
    return make_settings(MIPROSettings, settings).minimum_metric_calls(train, val)


def minimum_budget_gepa(task: str, train: int, val: int, program: str | None = None, **settings: Any) -> int:
    return make_settings(DSPyGEPASettings, settings).minimum_metric_calls(train, val)
