"""The names ``heldout run --optimizer NAME`` accepts, and the code each names.

:data:`REFERENCE_OPTIMIZERS` maps heldout's own names to ``module:function`` paths.

``local-search`` is the one name of the family searches (geometry random restarts, lockpicking
rule-table hill climbing); ``geometry-search`` and ``lockpicking-search`` are documented aliases
of it (:data:`ALIASES`): a run made under an alias is recorded, and shown, as ``local-search``.

An installed package adds optimizers through the entry-point group ``heldout.optimizers``
(``my-method = my_package.search:optimize``): the name then works wherever a reference name does.
A plugin is user code, so it runs isolated like any ``module:function`` (see
:func:`~heldout.optimizers.specs.is_reference_optimizer`), and it may not take a reference name or an alias: a name in a run
record always means one piece of code.
"""

from __future__ import annotations

import functools
import re
import warnings
from importlib.metadata import entry_points

from heldout.contracts import HeldoutError

REFERENCE_OPTIMIZERS: dict[str, str] = {
    "seed": "heldout.optimizers.seed:optimize",
    "placebo": "heldout.optimizers.placebo:optimize",
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

ENTRY_POINT_GROUP = "heldout.optimizers"
#: what a ``module:function`` target looks like
TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


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
        elif not TARGET.match(targets[0]) or not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name):
            warnings.warn(f"skipped optimizer plugin {name!r}: {targets[0]!r} is not module:function",
                          PluginSkipped, stacklevel=2)
        else:
            plugins[name] = targets[0]
    return plugins


def canonical_name(name: str) -> str:
    """The reference name an alias stands for (options after ``?`` kept; other names unchanged)."""
    base, sep, query = name.partition("?")
    return ALIASES.get(base, base) + sep + query


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
