"""The settings each library adapter passes to its library, as small frozen dataclasses, and the one
rule that reads a user's value for one of them (``--method-option NAME.KEY=VALUE``, a study file's
method ``options``, ``--optimizer gepa?KEY=VALUE``).

This module imports no library, so a study is checked (every key a field, every value of the
field's type and, where the field lists them, one of its ``choices``) before any session starts
and without the extras installed. The adapters record the settings a run used (``settings`` in
their run event), defaults included."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

from heldout.contracts import HeldoutError


def _choices(*values: str | None) -> dict[str, tuple]:
    return {"choices": values}


@dataclass(frozen=True)
class GEPASettings:
    """What ``--optimizer gepa`` passes to ``gepa.optimize`` (GEPA's own defaults otherwise).
    ``max_metric_calls`` None means the view's remaining budget."""

    reflection_minibatch_size: int = 3
    candidate_selection_strategy: str = field(default="pareto",
                                              metadata=_choices("pareto", "current_best", "epsilon_greedy"))
    use_merge: bool = False
    max_metric_calls: int | None = None
    perfect_score: float = 1.0


@dataclass(frozen=True)
class MIPROSettings:
    """A small zero-shot MIPROv2 run (instructions only) sized to the remaining budget. With
    ``auto`` set (``light``, ``medium``, ``heavy``), MIPROv2 sizes the run itself and ignores
    ``num_candidates`` and ``max_trials``; the budget is then held by the view's refusals, not by
    sizing (the run event says so)."""

    num_candidates: int = 3
    max_trials: int = 6
    minibatch_size: int = 5
    minibatch_full_eval_steps: int = 3
    num_threads: int = 1
    auto: str | None = field(default=None, metadata=_choices(None, "light", "medium", "heavy"))


@dataclass(frozen=True)
class DSPyGEPASettings:
    """What ``--optimizer dspy-gepa`` passes to ``dspy.GEPA`` (its budget is the view's remaining one)."""

    reflection_minibatch_size: int = 3
    use_merge: bool = False
    num_threads: int = 1


@dataclass(frozen=True)
class OpenEvolveSettings:
    """A small single-worker OpenEvolve run, sized to the budget."""

    max_iterations: int = 6
    num_islands: int = 1
    diff_based_evolution: bool = True
    cascade_threshold: float = 0.0
    timeout_seconds: int = 300


# The reference optimizers whose options are a library's settings (heldout.optimizers names them).
METHOD_SETTINGS: dict[str, type] = {"gepa": GEPASettings, "dspy-mipro": MIPROSettings, "dspy-gepa": DSPyGEPASettings,
                                    "openevolve": OpenEvolveSettings}

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def setting_value(settings_type: type, key: str, value: Any) -> Any:
    """``value`` (typed, from a TOML file, or text, from a flag) as field ``key`` of
    ``settings_type`` takes it; :class:`HeldoutError` naming the field and what it takes."""
    fields = {f.name: f for f in dataclasses.fields(settings_type)}
    if key not in fields:
        raise HeldoutError(f"{settings_type.__name__} has no setting {key!r} (settings: {', '.join(fields)})")
    kind = typing.get_type_hints(settings_type)[key]
    optional = type(None) in typing.get_args(kind)
    base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
    choices = fields[key].metadata.get("choices")
    took = f"{base.__name__}{' or none' if optional else ''}" + (
        f", one of {', '.join('none' if c is None else c for c in choices)}" if choices else "")
    given = value.strip() if isinstance(value, str) else value
    try:
        if optional and (given is None or given in ("none", "None", "")):
            converted = None
        elif base is bool:
            if isinstance(given, bool):
                converted = given
            elif isinstance(given, str) and given.lower() in _TRUE + _FALSE:
                converted = given.lower() in _TRUE
            else:
                raise ValueError
        elif base is int:
            if isinstance(given, bool) or not (isinstance(given, int) or (isinstance(given, str) and given.isdigit())):
                raise ValueError
            converted = int(given)
        elif base is float:
            if isinstance(given, bool) or not isinstance(given, (int, float, str)):
                raise ValueError
            converted = float(given)
        else:
            if not isinstance(given, str):
                raise ValueError
            converted = given
    except ValueError:
        raise HeldoutError(f"setting {key}={value!r} of {settings_type.__name__} must be {took}") from None
    if choices and converted not in choices:
        raise HeldoutError(f"setting {key}={value!r} of {settings_type.__name__} must be {took}")
    return converted


def make_settings(settings_type: type, options: Mapping[str, Any]):
    """``settings_type`` with ``options`` (each read by :func:`setting_value`), defaults elsewhere."""
    return settings_type(**{k: setting_value(settings_type, k, v) for k, v in options.items()})


__all__ = ["GEPASettings", "MIPROSettings", "DSPyGEPASettings", "OpenEvolveSettings", "METHOD_SETTINGS",
           "setting_value", "make_settings"]
