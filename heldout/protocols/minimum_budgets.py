"""The minimum-budget rule of a study: a cell whose budget is below its method's minimum useful
budget (:mod:`heldout.optimizers.minimums`) on its task and profile, times the metric calls one
program call costs under its verifier (``repeated:K``: K), is refused before any file of the
study exists: one line naming the cell, the minimum and why, exit 2. A run below the minimum
could only hand back the seed, and its ``ok`` would be the seed's score under the method's name.

Methods that state no minimum (user code, plugins, commands) are not checked here."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from heldout.adapters.settings import verifier_repeats
from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import HeldoutError
from heldout.data_manifests import Manifest
from heldout.optimizers.minimums import minimum_budget
from heldout.protocols.run import Method


class BelowMinimumBudget(HeldoutError):
    """A study cell's budget is below its method's minimum useful budget."""


def check_minimum_budgets(tasks: Sequence[str], profiles: Sequence[str], verifiers: Iterable[str],
                          budgets: Mapping[str, int], methods: Sequence[Method], origin: str = "study") -> None:
    """Raise :class:`BelowMinimumBudget` for the first (task, profile, method, verifier) whose
    budget cannot pay for the method's minimum; see the module docstring."""
    verifiers = list(verifiers) or ["decomposed"]
    for task in tasks:
        manifest = Manifest.load(get_benchmark(task).name)
        for profile in profiles:
            sizes = manifest.sizes(profile)
            train, val = int(sizes.get("train", 0)), int(sizes.get("val", 0))
            for method in methods:
                if method.command:
                    continue
                minimum = minimum_budget(method.target or method.name, method.options, task, train, val)
                if not minimum:
                    continue
                for verifier in verifiers:
                    needed = minimum * verifier_repeats(verifier)
                    if budgets[task] < needed:
                        cost = "" if needed == minimum else f" ({minimum} program calls x {needed // minimum} " \
                                                            f"under --verifier {verifier})"
                        raise BelowMinimumBudget(
                            f"{origin}: budget {budgets[task]} for {task} ({profile}: {train} train, {val} val) is "
                            f"below {method.name}'s minimum useful budget of {needed} metric calls{cost}: with less "
                            "it can only return the seed; raise the budget (docs/plug-an-optimizer.md, minimum "
                            "budgets); nothing was run or written")


__all__ = ["BelowMinimumBudget", "check_minimum_budgets"]
