"""Each optimizer's **minimum useful budget**: the fewest program calls in which it can judge one
candidate other than the seed against it. Below it a run can only hand back the seed, and an
``ok`` cell would be the seed's score under the method's name.

Every heldout optimizer states its own (``minimum_budget(task, train, val, **options)`` beside
``optimize``, ``minimum_budget_X`` beside ``optimize_X``; a library adapter's comes from its
settings, :mod:`heldout.adapters.settings`). A study whose budget is below a method's minimum is
refused before anything is written (:mod:`heldout.protocols.minimum_budgets`), and a library
adapter handed less at run time raises :class:`~heldout.adapters.settings.BudgetTooSmall`, so
its cell is ``failed``. User code states none and is never imported here."""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from heldout.contracts import HeldoutError
from heldout.optimizers.loading import is_heldout_code
from heldout.optimizers.registry import optimizer_target
from heldout.optimizers.specs import check_options, settings_type, split_spec


def minimum_budget(spec: str, options: Mapping[str, Any] | None, task: str, train: int, val: int) -> int | None:
    """The minimum useful budget of optimizer ``spec`` (with its ``?options`` and ``options``) on a
    profile of ``train`` and ``val`` examples, in program calls (under ``--verifier repeated:K``
    each costs K metric calls); None when the optimizer states none. Options the optimizer cannot
    take, or contradictory settings, are a :class:`HeldoutError`."""
    try:
        name, given = split_spec(spec)
    except ValueError as exc:
        raise HeldoutError(f"bad optimizer options in {spec!r}: {exc}") from None
    given.update(check_options(options or {}, spec, settings_type(name)))
    target = optimizer_target(name)
    if not is_heldout_code(target):
        return None
    module, _, function = target.partition(":")
    stated = getattr(importlib.import_module(module), function.replace("optimize", "minimum_budget", 1), None)
    return None if stated is None else int(stated(task, train, val, **given))


__all__ = ["minimum_budget"]
