"""Small reference optimizers so the suite runs end to end without an LLM.

Each is a callable ``optimize(view, seed) -> Candidate`` that touches the task only through the
:class:`~heldout.evaluators.session.TaskView` it is given. ``REFERENCE_OPTIMIZERS`` maps the names
``heldout run --optimizer NAME`` accepts to ``module:function`` paths.

``local-search`` is the one name of the family searches (geometry random restarts, lockpicking
rule-table hill climbing); ``geometry-search`` and ``lockpicking-search`` are documented aliases
of it (:data:`ALIASES`): a run made under an alias is recorded, and shown, as ``local-search``."""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from pathlib import Path
from typing import Callable

from heldout.contracts import BudgetExceeded, HeldoutError

REFERENCE_OPTIMIZERS: dict[str, str] = {
    "seed": "heldout.optimizers.seed:optimize",
    "local-search": "heldout.optimizers.local_search:optimize",
    "reflective": "heldout.optimizers.reflective:optimize",
}
ALIASES: dict[str, str] = {"geometry-search": "local-search", "lockpicking-search": "local-search"}


def canonical_name(name: str) -> str:
    """The reference name an alias stands for (any other name unchanged)."""
    return ALIASES.get(name, name)


def mean_train_score(view, candidate, ids) -> float | None:
    """The candidate's mean score on train ``ids``, or None when the budget cannot pay for it
    (the reference optimizers stop there rather than letting BudgetExceeded escape)."""
    if view.remaining < len(ids):
        return None
    try:
        results = view.evaluate(candidate, "train", ids)
    except BudgetExceeded:
        return None
    return sum(r["score"] for r in results) / len(results) if results else None


def optimizer_target(name: str) -> str:
    """``module:function`` for a reference name, an alias or a ``module:function``."""
    target = REFERENCE_OPTIMIZERS.get(canonical_name(name), name)
    if ":" not in target:
        raise HeldoutError(f"unknown optimizer {name!r}: use one of {', '.join(REFERENCE_OPTIMIZERS)} "
                           f"(aliases: {', '.join(f'{a} = {c}' for a, c in ALIASES.items())}) or module:function")
    return target


def resolve_optimizer(name: str) -> Callable:
    """A reference name (or alias) or ``module:function``. A user's module is looked up on the
    path with the current directory on it, as ``python -m`` would (no PYTHONPATH=. needed)."""
    target = optimizer_target(name)
    module, _, func = target.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        optimizer = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise HeldoutError(f"cannot load optimizer {target!r}: {exc}") from exc
    if not callable(optimizer):
        raise HeldoutError(f"optimizer {target!r} is not callable")
    return optimizer


def optimizer_code_sha256(name: str) -> str | None:
    """sha256 of the source file that defines the optimizer (None when it has no file), so a
    run record says which version of the code ran."""
    optimizer = resolve_optimizer(name)
    module = sys.modules.get(getattr(optimizer, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if not path or not os.path.exists(path):
        return None
    digest = hashlib.sha256(Path(path).read_bytes())
    # the reference searches dispatch to sibling modules: hash those too
    for extra in sorted(getattr(module, "CODE_FILES", ())):
        digest.update(Path(path).with_name(extra).read_bytes())
    return digest.hexdigest()
