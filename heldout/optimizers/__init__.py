"""Small reference optimizers so the suite runs end to end without an LLM.

Each is a callable ``optimize(view, seed) -> Candidate`` that touches the task only through the
:class:`~heldout.evaluators.session.TaskView` it is given. ``REFERENCE_OPTIMIZERS`` maps the names
``heldout run --optimizer NAME`` accepts to ``module:function`` paths.

``local-search`` is the one name of the family searches (geometry random restarts, lockpicking
rule-table hill climbing); ``geometry-search`` and ``lockpicking-search`` are documented aliases
of it (:data:`ALIASES`): a run made under an alias is recorded, and shown, as ``local-search``.

An installed package adds optimizers through the entry-point group ``heldout.optimizers``
(``my-method = my_package.search:optimize``): the name then works wherever a reference name does.
A plugin is user code, so it runs isolated like any ``module:function`` (see
:func:`is_reference_optimizer`), and it may not take a reference name or an alias: a name in a run
record always means one piece of code.

An optimizer spec may carry options after ``?``: ``lockpicking-search?width=4&stream=1``. Only
the options in :data:`OPTIMIZER_OPTIONS` (each a non-negative int) and :data:`CODE_OPTIONS` (a
``module:function`` of the user's code, e.g. ``dspy-mipro?program=my_program:build``) are
accepted, and only by an optimizer whose function takes them as keyword arguments. A spec whose
options name user code is not a reference optimizer: that code runs isolated like any
``module:function`` (:func:`user_code`)."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import warnings
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import parse_qsl

from heldout.contracts import BudgetExceeded, HeldoutError

REFERENCE_OPTIMIZERS: dict[str, str] = {
    "seed": "heldout.optimizers.seed:optimize",
    "local-search": "heldout.optimizers.local_search:optimize",
    "reflective": "heldout.optimizers.reflective:optimize",
    "constant-search": "heldout.optimizers.constant_search:optimize",
    # the real libraries, through heldout.adapters (extras [gepa], [dspy], [openevolve])
    "gepa": "heldout.optimizers.gepa:optimize",
    "dspy-mipro": "heldout.optimizers.dspy:optimize_mipro",
    "dspy-gepa": "heldout.optimizers.dspy:optimize_gepa",
    "openevolve": "heldout.optimizers.openevolve:optimize",
}
ALIASES: dict[str, str] = {"geometry-search": "local-search", "lockpicking-search": "local-search"}

OPTIMIZER_OPTIONS = {"width": 1, "stream": 0}
"""Option -> its smallest value: ``width`` = workers proposing from one parent per round, merged
(:mod:`heldout.optimizers.merge`); ``stream`` = which independent random stream a run draws from
(the fork arm's runs differ only in it)."""


CODE_OPTIONS = {"program": "a DSPy program factory, module:function, returning the dspy.Module to optimise"}
"""Option -> what it names: options whose value is the user's code (``module:function``)."""


ENTRY_POINT_GROUP = "heldout.optimizers"
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class PluginSkipped(UserWarning):
    """An optimizer plugin was left out (its name or its target is not acceptable); the warning says why."""


@functools.lru_cache(maxsize=1)
def plugin_optimizers() -> dict[str, str]:
    """Name -> ``module:function`` of every installed ``heldout.optimizers`` entry point. Never
    imports a plugin (a broken one fails when it is used, naming itself). Left out, with a
    :class:`PluginSkipped` warning: a name a reference optimizer or an alias holds, a target that
    is not ``module:function``, and a second plugin of one name (neither is taken)."""
    found: dict[str, list[str]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, []).append(ep.value.strip())
    plugins = {}
    for name, targets in sorted(found.items()):
        if name in REFERENCE_OPTIMIZERS or name in ALIASES:
            warnings.warn(f"skipped optimizer plugin {name!r}: the name is heldout's own", PluginSkipped, stacklevel=2)
        elif len(set(targets)) > 1:
            warnings.warn(f"skipped optimizer plugin {name!r}: installed twice ({', '.join(targets)})",
                          PluginSkipped, stacklevel=2)
        elif not _TARGET.match(targets[0]) or not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name):
            warnings.warn(f"skipped optimizer plugin {name!r}: {targets[0]!r} is not module:function",
                          PluginSkipped, stacklevel=2)
        else:
            plugins[name] = targets[0]
    return plugins


def is_reference_optimizer(name: str) -> bool:
    """True for heldout's own optimizers (reference names and aliases, options allowed) whose
    options name no user code, the only ones that run in-process without ``--trusted-optimizer``."""
    return canonical_name(name).partition("?")[0] in REFERENCE_OPTIMIZERS and not user_code(name)


def user_code(spec: str, options: Mapping[str, Any] | None = None) -> list[str]:
    """The ``module:function`` targets of user code named by the :data:`CODE_OPTIONS` of ``spec``
    (after ``?``) and of ``options`` (a study file's method options), in option order."""
    query = spec.partition("?")[2]
    given = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    given.update(options or {})
    return [str(given[key]) for key in CODE_OPTIONS if key in given]


def canonical_name(name: str) -> str:
    """The reference name an alias stands for (options after ``?`` kept; other names unchanged)."""
    base, sep, query = name.partition("?")
    return ALIASES.get(base, base) + sep + query


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


def split_spec(spec: str) -> tuple[str, dict[str, int | str]]:
    """``NAME?width=4&stream=1`` -> (``NAME``, {"width": 4, "stream": 1}); the values checked by
    :func:`check_options`."""
    name, _, query = spec.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))) if query else {}
    return name, check_options(options, spec)


def check_options(options: Mapping[str, Any], where: str) -> dict[str, int | str]:
    """Options as an optimizer function receives them: an :data:`OPTIMIZER_OPTIONS` value is an int
    at least its minimum (given as an int or as digits), a :data:`CODE_OPTIONS` value is
    ``module:function``; a clear error for anything else."""
    checked: dict[str, int | str] = {}
    for key, value in options.items():
        if key in CODE_OPTIONS:
            if not isinstance(value, str) or not _TARGET.match(value):
                raise HeldoutError(f"optimizer option {key}={value!r} must be module:function ({CODE_OPTIONS[key]})")
            checked[key] = value
        elif key in OPTIMIZER_OPTIONS:
            digits = str(value) if not isinstance(value, bool) else ""
            if not digits.isdigit() or int(digits) < OPTIMIZER_OPTIONS[key]:
                raise HeldoutError(f"optimizer option {key}={value!r} must be an int >= {OPTIMIZER_OPTIONS[key]}")
            checked[key] = int(digits)
        else:
            raise HeldoutError(f"optimizer option {key!r} is not one of "
                               f"{', '.join([*OPTIMIZER_OPTIONS, *CODE_OPTIONS])} (in {where!r})")
    return checked


def optimizer_target(name: str) -> str:
    """``module:function`` for a reference name, an alias, a plugin's name or a ``module:function``
(options dropped)."""
    base = name.partition("?")[0]
    target = REFERENCE_OPTIMIZERS.get(canonical_name(base)) or plugin_optimizers().get(base, base)
    if ":" not in target:
        plugins = f"; installed plugins: {', '.join(plugin_optimizers())}" if plugin_optimizers() else ""
        raise HeldoutError(f"unknown optimizer {base!r}: use one of {', '.join(REFERENCE_OPTIMIZERS)} "
                           f"(aliases: {', '.join(f'{a} = {c}' for a, c in ALIASES.items())}){plugins} "
                           "or module:function")
    return target


def resolve_optimizer(spec: str) -> Callable:
    """A reference name (or alias) or ``module:function``, optionally with ``?options`` (see the
    module doc). A user's module is looked up with the current directory on the path, as
    ``python -m`` would (no PYTHONPATH=. needed)."""
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
    return load_function(optimizer_target(name), "optimizer")


def load_function(target: str, what: str) -> Callable:
    """The callable ``module:function`` names (a ``what``: optimizer, DSPy program factory),
    imported with the current directory on the path, as ``python -m`` would."""
    module, _, func = target.partition(":")
    _cwd_on_path()
    try:
        found = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise HeldoutError(f"cannot load {what} {target!r}: {exc}") from exc
    if not callable(found):
        raise HeldoutError(f"{what} {target!r} is not callable")
    return found


def optimizer_code_sha256(name: str, options: Mapping[str, Any] | None = None) -> str | None:
    """sha256 of the source file that defines the optimizer (None when it has no file), and of
    the files of the user code its options name (:func:`user_code`; found, not imported), so a
    run record says which version of the code ran."""
    optimizer = _load(name.partition("?")[0])
    module = sys.modules.get(getattr(optimizer, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if not path or not os.path.exists(path):
        return None
    digest = hashlib.sha256(Path(path).read_bytes())
    # the reference searches dispatch to sibling modules: hash those too
    for extra in sorted(getattr(module, "CODE_FILES", ())):
        digest.update(Path(path).with_name(extra).read_bytes())
    for target in user_code(name, options):
        digest.update(target.encode())
        digest.update(_source_bytes(target.partition(":")[0]))
    return digest.hexdigest()


def _source_bytes(module: str) -> bytes:
    """The source of ``module`` as found on the path (a dotted name imports its parent packages,
    never the module itself); empty when it has no source file."""
    _cwd_on_path()
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        raise HeldoutError(f"cannot find the module {module!r}: {exc}") from exc
    if spec is None:
        raise HeldoutError(f"cannot find the module {module!r} (looked in the current directory and on sys.path)")
    origin = spec.origin if spec.has_location else None
    return Path(origin).read_bytes() if origin and os.path.isfile(origin) else b""


def _cwd_on_path() -> None:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
