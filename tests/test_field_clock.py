"""Field conditions: a wall clock that jumps.

In the lab the system clock only moves forward at one second a second. In the field it is stepped:
NTP corrects a drifted clock, a virtual machine resumes from a pause or migrates, a laptop wakes,
an administrator sets the date. A duration that decides a verdict or a budget must be measured
on a clock that never jumps (``time.monotonic``), never as a difference of ``time.time()``.

Stepping the real clock needs CAP_SYS_TIME and moves it for every process of the machine
(the other engineers' runs included), so the step is made for the module under test only: its
``time.time`` jumps by an hour while its ``time.monotonic`` stays the real one."""

from __future__ import annotations

import time
import types

import pytest

import heldout
from heldout.contracts import BudgetExceeded
from heldout.evaluators import evaluation
from heldout.evaluators.session import Budget, Session

HOUR = 3600.0


def stepped_clock(offset: float) -> types.SimpleNamespace:
    """The ``time`` module as a process sees it after the system clock was stepped by ``offset``."""
    names = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    return types.SimpleNamespace(**{**names, "time": lambda: time.time() + offset})


@pytest.mark.parametrize("offset, wall_seconds", [(HOUR, 60.0), (-HOUR, 1.0)], ids=["stepped-forward", "stepped-back"])
def test_a_clock_stepped_during_a_session_neither_ends_nor_extends_its_wall_budget(offset, wall_seconds, tmp_path,
                                                                                    monkeypatch):
    session = Session(heldout.load_task("lockpicking/six"), budget=Budget(4, wall_seconds=wall_seconds), seed=0,
                      run_dir=tmp_path / "run")
    view = session.view
    first = view.train[0]["id"]
    monkeypatch.setattr(evaluation, "time", stepped_clock(offset))
    if offset > 0:  # a second or so has passed of a budget of a minute: not used up
        assert len(view.evaluate(view.seed_candidate, "train", [first])) == 1
    else:  # a real second and a half has passed: the budget of one second is used up
        time.sleep(1.5)
        with pytest.raises(BudgetExceeded, match="wall-time"):
            view.evaluate(view.seed_candidate, "train", [first])
