"""Optimizer specs: a name and its options, ``NAME?option=value&...``.

An optimizer spec may carry options after ``?``: ``lockpicking-search?width=4&stream=1``. Only
the options in :data:`OPTIMIZER_OPTIONS` (each a non-negative int) and :data:`CODE_OPTIONS` (a
``module:function`` of the user's code, e.g. ``dspy-mipro?program=my_program:build``) are
accepted, and only by an optimizer whose function takes them as keyword arguments. A spec whose
options name user code is not a reference optimizer: that code runs isolated like any
``module:function`` (:func:`user_code`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping
from urllib.parse import parse_qsl

from heldout.adapters.settings import METHOD_SETTINGS, setting_value
from heldout.contracts import HeldoutError
from heldout.optimizers.registry import REFERENCE_OPTIMIZERS, TARGET, canonical_name

OPTIMIZER_OPTIONS = {"width": 1, "stream": 0}
"""Option -> its smallest value: ``width`` = workers proposing from one parent per round, merged
(:mod:`heldout.optimizers.merge`); ``stream`` = which independent random stream a run draws from
(the fork arm's runs differ only in it)."""


CODE_OPTIONS = {"program": "a DSPy program factory, module:function, returning the dspy.Module to optimise"}
"""Option -> what it names: options whose value is the user's code (``module:function``)."""


def is_reference_optimizer(name: str) -> bool:
    """True for heldout's own optimizers (reference names and aliases, options allowed) whose
    options name no user code, the only ones that run in-process without ``--trusted-optimizer``."""
    return canonical_name(name).partition("?")[0] in REFERENCE_OPTIMIZERS and not user_code(name)


def user_code(spec: str, options: Mapping[str, Any] | None = None) -> list[str]:
    """The ``module:function`` targets of user code named by the :data:`CODE_OPTIONS` of ``spec``
    (after ``?``) and of ``options`` (a study file's method options), in option order."""
    return list(code_options(spec, options).values())


def code_options(spec: str, options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Option -> ``module:function`` for the :data:`CODE_OPTIONS` of ``spec`` and ``options``
    (those of ``options`` win), in option order."""
    query = spec.partition("?")[2]
    given = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    given.update(options or {})
    return {key: str(given[key]) for key in CODE_OPTIONS if key in given}


def split_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME?width=4&stream=1`` -> (``NAME``, {"width": 4, "stream": 1}); the values checked by
    :func:`check_options`."""
    name, _, query = spec.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))) if query else {}
    return name, check_options(options, spec, settings_type(name))


def settings_type(name: str) -> type | None:
    """The settings dataclass (:mod:`heldout.adapters.settings`) whose fields are further options
    of the reference optimizer ``name`` (a library adapter's settings), or None."""
    return METHOD_SETTINGS.get(canonical_name(name).partition("?")[0])


def check_options(options: Mapping[str, Any], where: str, settings: type | None = None) -> dict[str, Any]:
    """Options as an optimizer function receives them: an :data:`OPTIMIZER_OPTIONS` value is an int
    at least its minimum (given as an int or as digits), a :data:`CODE_OPTIONS` value is
    ``module:function``, a field of ``settings`` (a library adapter's settings dataclass) is of
    that field's type (:func:`~heldout.adapters.settings.setting_value`); a clear error for
    anything else."""
    checked: dict[str, Any] = {}
    fields = [f.name for f in dataclasses.fields(settings)] if settings else []
    for key, value in options.items():
        if key in fields:
            checked[key] = setting_value(settings, key, value)
        elif key in CODE_OPTIONS:
            if not isinstance(value, str) or not TARGET.match(value):
                raise HeldoutError(f"optimizer option {key}={value!r} must be module:function ({CODE_OPTIONS[key]})")
            checked[key] = value
        elif key in OPTIMIZER_OPTIONS:
            digits = str(value) if not isinstance(value, bool) else ""
            if not digits.isdigit() or int(digits) < OPTIMIZER_OPTIONS[key]:
                raise HeldoutError(f"optimizer option {key}={value!r} must be an int >= {OPTIMIZER_OPTIONS[key]}")
            checked[key] = int(digits)
        else:
            raise HeldoutError(f"optimizer option {key!r} is not one of "
                               f"{', '.join([*OPTIMIZER_OPTIONS, *CODE_OPTIONS, *fields])} (in {where!r})")
    return checked
