"""Small reference optimizers so the suite runs end to end without an LLM.

Each is a callable ``optimize(view, seed) -> Candidate`` that touches the task only through the
:class:`~heldout.evaluators.session.TaskView` it is given. ``REFERENCE_OPTIMIZERS`` maps the names
``heldout run --optimizer NAME`` accepts to ``module:function`` paths.

An optimizer spec may carry options after ``?``: ``lockpicking-search?width=4&stream=1``. Only
the options in :data:`OPTIMIZER_OPTIONS` are accepted (each a non-negative int), and only by an
optimizer whose function takes them as keyword arguments."""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Callable
from urllib.parse import parse_qsl

from heldout.contracts import BudgetExceeded, HeldoutError

REFERENCE_OPTIMIZERS: dict[str, str] = {
    "seed": "heldout.optimizers.seed:optimize",
    "geometry-search": "heldout.optimizers.geometry_search:optimize",
    "lockpicking-search": "heldout.optimizers.lockpicking_search:optimize",
    "reflective": "heldout.optimizers.reflective:optimize",
    "local-search": "heldout.optimizers.local_search:optimize",
    "constant-search": "heldout.optimizers.constant_search:optimize",
}

OPTIMIZER_OPTIONS = {"width": 1, "stream": 0}
"""Option -> its smallest value: ``width`` = workers proposing from one parent per round, merged
(:mod:`heldout.optimizers.merge`); ``stream`` = which independent random stream a run draws from
(the fork arm's runs differ only in it)."""


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


def split_spec(spec: str) -> tuple[str, dict[str, int]]:
    """``NAME?width=4&stream=1`` -> (``NAME``, {"width": 4, "stream": 1}); a clear error for an
    option not in :data:`OPTIMIZER_OPTIONS` or a value that is not an int at least its minimum."""
    name, _, query = spec.partition("?")
    options: dict[str, int] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)) if query else []:
        if key not in OPTIMIZER_OPTIONS:
            raise HeldoutError(f"optimizer option {key!r} is not one of {', '.join(OPTIMIZER_OPTIONS)} (in {spec!r})")
        if not value.isdigit() or int(value) < OPTIMIZER_OPTIONS[key]:
            raise HeldoutError(f"optimizer option {key}={value!r} must be an int >= {OPTIMIZER_OPTIONS[key]}")
        options[key] = int(value)
    return name, options


def resolve_optimizer(spec: str) -> Callable:
    """A reference name or ``module:function``, optionally with ``?options`` (see the module doc)."""
    try:
        name, options = split_spec(spec)
    except ValueError as exc:  # parse_qsl's own complaint about a malformed query
        raise HeldoutError(f"bad optimizer options in {spec!r}: {exc}") from None
    optimizer = _load(name)
    if not options:
        return optimizer
    accepted = inspect.signature(optimizer).parameters
    refused = [k for k in options if k not in accepted]
    if refused:
        raise HeldoutError(f"optimizer {name!r} takes no option {', '.join(refused)}")
    return functools.partial(optimizer, **options)


def _load(name: str) -> Callable:
    target = REFERENCE_OPTIMIZERS.get(name, name)
    if ":" not in target:
        raise HeldoutError(f"unknown optimizer {name!r}: use one of {', '.join(REFERENCE_OPTIMIZERS)} "
                           "or module:function")
    module, _, func = target.partition(":")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise HeldoutError(f"cannot load optimizer {target!r}: {exc}") from exc
