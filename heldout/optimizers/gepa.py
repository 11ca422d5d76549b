"""``gepa``: GEPA 0.1.4 itself, through :mod:`heldout.adapters.gepa` (prompt tasks; needs an
architect model, which GEPA uses as its reflection LM). Its options are the fields of
:class:`~heldout.adapters.settings.GEPASettings` (``--method-option gepa.use_merge=true``)."""

from __future__ import annotations

from typing import Any

from heldout.adapters.gepa import optimize as run_gepa
from heldout.adapters.settings import GEPASettings, make_settings
from heldout.contracts import Candidate, TaskView


def optimize(view: TaskView, seed: int, **settings: Any) -> Candidate:
    return run_gepa(view, seed, make_settings(GEPASettings, settings))


def minimum_budget(task: str, train: int, val: int, **settings: Any) -> int:
    return make_settings(GEPASettings, settings).minimum_metric_calls(train, val)
