"""``openevolve``: OpenEvolve 0.4.0 itself, through :mod:`heldout.adapters.openevolve` (program
tasks; needs an architect model, OpenEvolve's LLM). Its options are the fields of
:class:`~heldout.adapters.settings.OpenEvolveSettings` (``--method-option openevolve.num_islands=2``)."""

from __future__ import annotations

from typing import Any

from heldout.adapters.openevolve import optimize as run_openevolve
from heldout.adapters.settings import OpenEvolveSettings, make_settings
from heldout.contracts import Candidate, TaskView


def optimize(view: TaskView, seed: int, **settings: Any) -> Candidate:
    return run_openevolve(view, seed, make_settings(OpenEvolveSettings, settings))


def minimum_budget(task: str, train: int, val: int, **settings: Any) -> int:
    return make_settings(OpenEvolveSettings, settings).minimum_metric_calls(train, val)
