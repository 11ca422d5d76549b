"""The settings each library adapter passes to its library, as small frozen dataclasses, and the one
rule that reads a user's value for one of them (``--method-option NAME.KEY=VALUE``, a study file's
method ``options``, ``--optimizer gepa?KEY=VALUE``).

This module imports no library, so a study is checked (every key a field, every value of the
field's type and, where the field lists them, one of its ``choices``) before any session starts
and without the extras installed. The adapters record the settings a run used (``settings`` in
their run event), defaults included.

Each settings class also states its run's **minimum useful budget**
(``minimum_metric_calls(train, val)``): the fewest metric calls in which the library can judge one
candidate other than the seed against it. A study whose budget is smaller is refused before it
starts (:mod:`heldout.optimizers.minimums`), and an adapter handed a smaller one raises
:class:`BudgetTooSmall` (its cell is ``failed``, never ``ok`` on the seed's score)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

from heldout.contracts import HeldoutError


def _choices(*values: str | None) -> dict[str, tuple]:
    return {"choices": values}


DSPY_MIPRO_DEFAULT_DEMOS = 4  # MIPROv2's max_bootstrapped_demos and max_labeled_demos in dspy 3.4.1
MIPRO_AUTO = {"light": {"n": 6, "val_size": 100}, "medium": {"n": 12, "val_size": 300},
              "heavy": {"n": 18, "val_size": 1000}}  # dspy 3.4.1's AUTO_RUN_SETTINGS


class BudgetTooSmall(HeldoutError):
    """The budget is below the method's minimum useful budget: nothing was spent, and the cell is
    not a result (an ``ok`` here would be the seed's score under the method's name)."""


def refuse_below_minimum(method: str, remaining: int, minimum: int, repeats: int = 1) -> None:
    """Raise :class:`BudgetTooSmall` when ``remaining`` metric calls cannot pay for ``minimum``
    program calls (each charged ``repeats`` metric calls under ``--verifier repeated:K``)."""
    if remaining < minimum * repeats:
        raise BudgetTooSmall(f"{method} needs at least {minimum * repeats} metric calls to judge one candidate "
                             f"against the seed; {remaining} left (see docs/plug-an-optimizer.md, minimum budgets)")


def verifier_repeats(verifier: str | None) -> int:
    """Metric calls one evaluation of one example costs under a verifier spec (``repeated:K``,
    alone or joined with ``+``, costs K; every other verifier 1)."""
    repeats = 1
    for part in str(verifier or "").split("+"):
        kind, _, count = part.strip().partition(":")
        if kind == "repeated" and count.isdigit() and int(count) >= 1:
            repeats = int(count)
    return repeats


def gepa_minimum_cost(val_size: int, minibatch: int) -> int:
    """The fewest metric calls in which GEPA (or dspy.GEPA) can accept a candidate: the seed on the val set,
    the parent and one proposed child on a reflection minibatch, and the child on the val set."""
    return 2 * val_size + 2 * minibatch


def val_size_for_budget(val_size: int, minibatch: int, budget: int) -> int:
    """How many val examples (the first ones) dspy.GEPA validates on so that ``budget`` can pay
    for accepting one candidate (:func:`gepa_minimum_cost`): all of them when it can, else as many
    as fit (0: none). With the whole val set on a small budget, the budget would go to the
    seed's partial val pass and the run could only return the seed."""
    return max(0, min(val_size, (budget - 2 * minibatch) // 2))


def mipro_cost(val_size: int, trials: int, settings: "MIPROSettings") -> int:
    """A bound on the metric calls of MIPROv2's trials, used to size it to the budget: the default
    program on the full val set, a minibatch per trial, a full val pass every
    ``minibatch_full_eval_steps`` trials and one more at the end (plus one of slack for optuna's
    numbering). The few-shot bootstrap over train comes before (:meth:`MIPROSettings.bootstrap_bound`)."""
    minibatch = min(settings.minibatch_size, val_size)
    if minibatch >= val_size:
        return val_size * (1 + trials)
    full = trials // settings.minibatch_full_eval_steps + 2
    return val_size * (1 + full) + trials * minibatch


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

    def minimum_metric_calls(self, train: int, val: int) -> int:
        """GEPA validates on the whole val set (train when the profile has none): the seed there,
        parent and child on one reflection minibatch, and the child there."""
        return gepa_minimum_cost(val or train, min(self.reflection_minibatch_size, train))


@dataclass(frozen=True)
class MIPROSettings:
    """A MIPROv2 run as DSPy users run it: instructions *and* few-shot demos (up to 4 bootstrapped
    and 4 labeled), proposed with the program-, data-, tip- and few-shot-aware proposers, DSPy's
    defaults. ``zero_shot`` is heldout's earlier reduced form, kept as a named setting: no demos,
    and neither the program- nor the data-aware proposer. A demo or proposer field left ``None``
    takes DSPy's default (or the zero-shot value); a demo count above 0 under ``zero_shot`` is an
    error, not a silent override.

    Heldout sizes the run to the remaining budget (``num_candidates`` instruction and demo
    candidates, trials cut until :func:`mipro_cost` fits what the bootstrap left). With ``auto``
    set (``light``, ``medium``, ``heavy``, DSPy's own default being ``light``), MIPROv2 sizes the
    run itself and ignores ``num_candidates`` and ``max_trials``; the budget is then held by the
    view's refusals, not by sizing (the run event says so)."""

    num_candidates: int = 3
    max_trials: int = 6
    minibatch_size: int = 5
    minibatch_full_eval_steps: int = 3
    num_threads: int = 1
    auto: str | None = field(default=None, metadata=_choices(None, "light", "medium", "heavy"))
    zero_shot: bool = False
    max_bootstrapped_demos: int | None = None
    max_labeled_demos: int | None = None
    program_aware_proposer: bool | None = None
    data_aware_proposer: bool | None = None
    tip_aware_proposer: bool = True
    fewshot_aware_proposer: bool = True

    def passed_to_dspy(self) -> dict[str, Any]:
        """The demo and proposer settings MIPROv2 receives (None fields resolved); a demo count
        above 0 under ``zero_shot`` is a :class:`HeldoutError`."""
        demos = 0 if self.zero_shot else DSPY_MIPRO_DEFAULT_DEMOS
        aware = not self.zero_shot
        if self.zero_shot and (self.max_bootstrapped_demos or self.max_labeled_demos):
            raise HeldoutError("MIPROSettings: zero_shot=true proposes no demos; drop max_bootstrapped_demos / "
                               "max_labeled_demos or zero_shot")
        return {"max_bootstrapped_demos": demos if self.max_bootstrapped_demos is None else self.max_bootstrapped_demos,
                "max_labeled_demos": demos if self.max_labeled_demos is None else self.max_labeled_demos,
                "program_aware_proposer": aware if self.program_aware_proposer is None else self.program_aware_proposer,
                "data_aware_proposer": aware if self.data_aware_proposer is None else self.data_aware_proposer,
                "tip_aware_proposer": self.tip_aware_proposer, "fewshot_aware_proposer": self.fewshot_aware_proposer}

    def candidates(self) -> int:
        """Instruction and demo candidates: ``num_candidates``, or the ``auto`` mode's own n."""
        return MIPRO_AUTO[self.auto]["n"] if self.auto else self.num_candidates

    def bootstrap_bound(self, train: int) -> int:
        """The most program calls MIPROv2's few-shot bootstrap can make on train before its first
        trial: each of its ``candidates() - 2`` BootstrapFewShot passes may run every train example
        (a pass stops early once it has its demos; the zero-shot and labels-only sets cost
        nothing). Zero-shot MIPROv2 bootstraps too, for its proposer's context; only labeled demos
        without bootstrapped ones make the passes free."""
        passed = self.passed_to_dspy()
        if not passed["max_bootstrapped_demos"] and passed["max_labeled_demos"]:
            return 0
        return max(0, self.candidates() - 2) * train

    def minimum_metric_calls(self, train: int, val: int) -> int:
        """The bootstrap's bound and one trial: the default program on the val set (train when
        the profile has none), one trial, and the full evaluations around it."""
        selection = val or train
        if self.auto:
            selection = min(selection, MIPRO_AUTO[self.auto]["val_size"])
        return self.bootstrap_bound(train) + mipro_cost(selection, 1, self)


@dataclass(frozen=True)
class DSPyGEPASettings:
    """What ``--optimizer dspy-gepa`` passes to ``dspy.GEPA`` (its budget is the view's remaining one)."""

    reflection_minibatch_size: int = 3
    use_merge: bool = False
    num_threads: int = 1

    def minimum_metric_calls(self, train: int, val: int) -> int:
        """The adapter validates on as many val examples as the budget pays for, at least one:
        the seed and a child on one, parent and child on one reflection minibatch."""
        return 2 + 2 * min(self.reflection_minibatch_size, train)


@dataclass(frozen=True)
class OpenEvolveSettings:
    """A small single-worker OpenEvolve run, sized to the budget."""

    max_iterations: int = 6
    num_islands: int = 1
    diff_based_evolution: bool = True
    cascade_threshold: float | None = None
    """The stage-1 mean score, in the metric's own units, a program must reach (a score at least
    it; a lower-is-better metric's cost at most it) to be scored on the rest; None: every program
    goes on (what 0.0 did for a score in [0, 1], and what no number does for a cost)."""
    timeout_seconds: int = 300

    def minimum_metric_calls(self, train: int, val: int) -> int:
        """One full evaluation (train and val) of the seed and of one iteration's child."""
        return 2 * max(1, train + val)


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


__all__ = ["BudgetTooSmall", "refuse_below_minimum", "mipro_cost", "gepa_minimum_cost", "val_size_for_budget",
           "verifier_repeats", "GEPASettings",
           "MIPROSettings", "DSPyGEPASettings", "OpenEvolveSettings", "METHOD_SETTINGS", "setting_value",
           "make_settings"]
