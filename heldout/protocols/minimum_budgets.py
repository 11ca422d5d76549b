"""The minimum-budget rule: a cell whose budget is below its method's minimum useful budget
(:mod:`heldout.optimizers.minimums`) on its task and profile, times the metric calls one program
call costs under its verifier (``repeated:K``: K), is refused before any file exists: one line
naming the cell, the minimum and why, exit 2. A run below the minimum could only hand back the
seed, and its ``ok`` would be the seed's score under the method's name.

Every command that plans cells asks :func:`check_minimum_budgets` of them (``run``, ``compare
arms``, ``compare verifiers``, ``protocol generalisation``), and ``leak ablate`` asks it of the
cells its run records describe (:func:`recorded_cells`) before it scores anything: a run below
the minimum is the seed under another name, and its "gain" would be read as the method's.

Methods that state no minimum (user code, plugins, commands) are not checked here."""

from __future__ import annotations

from typing import Iterable

from heldout.adapters.settings import verifier_repeats
from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import HeldoutError
from heldout.data_manifests import manifest_holding
from heldout.evaluators.records import RunRecord
from heldout.evaluators.scoring import Decoding
from heldout.optimizers import REFERENCE_OPTIMIZERS
from heldout.optimizers.minimums import minimum_budget
from heldout.protocols.run import Cell, Method

RAISE_THE_BUDGET = "raise the budget"


class BelowMinimumBudget(HeldoutError):
    """A cell's budget is below its method's minimum useful budget."""


def check_minimum_budgets(cells: Iterable[Cell], origin: str, remedy: str = RAISE_THE_BUDGET) -> None:
    """Raise :class:`BelowMinimumBudget` for the first cell whose budget cannot pay for its
    method's minimum (see the module docstring); ``remedy`` is what the line tells the person to do."""
    sizes: dict[tuple[str, str], tuple[int, int]] = {}
    minimums: dict[tuple[str, str, str], int | None] = {}  # cells differ by seed: each minimum is asked once
    for cell in cells:
        if cell.method.command:
            continue
        if (cell.task, cell.profile) not in sizes:
            name = get_benchmark(cell.task).name
            split_sizes = manifest_holding(name, cell.profile).sizes(cell.profile)
            sizes[cell.task, cell.profile] = int(split_sizes.get("train", 0)), int(split_sizes.get("val", 0))
        train, val = sizes[cell.task, cell.profile]
        key = (cell.task, cell.profile, cell.method.name)
        if key not in minimums:
            minimums[key] = minimum_budget(cell.method.target or cell.method.name, cell.method.options,
                                           cell.task, train, val)
        minimum = minimums[key]
        needed = (minimum or 0) * verifier_repeats(cell.verifier)
        if cell.budget >= needed:
            continue
        cost = "" if needed == minimum else f" ({minimum} program calls x {needed // minimum} " \
                                            f"under --verifier {cell.verifier})"
        raise BelowMinimumBudget(
            f"{origin}: budget {cell.budget} for {cell.task} ({cell.profile}: {train} train, {val} val) is below "
            f"{cell.method.name}'s minimum useful budget of {needed} metric calls{cost}: with less it can only "
            f"return the seed; {remedy} (docs/plug-an-optimizer.md, minimum budgets); nothing was run or written")


def recorded_cells(records: Iterable[RunRecord]) -> list[Cell]:
    """The cells of finished run records whose optimizer is one of heldout's reference optimizers
    (named in the record by its ``module:function`` target); the others state no minimum (user
    code, commands) or name no optimizer (a session made through the Python API)."""
    reference = {target: name for name, target in REFERENCE_OPTIMIZERS.items()}
    cells = []
    for record in records:
        optimizer = record.experiment.get("optimizer") or {}
        metric_calls = (record.budget or {}).get("metric_calls")
        if optimizer.get("target") not in reference or metric_calls is None:
            continue
        method = Method(record.method, reference[optimizer["target"]], options=dict(optimizer.get("options") or {}))
        cells.append(Cell(record.task, method, record.seed, int(metric_calls), record.profile, record.task_options,
                          record.verifier, decoding=Decoding(**record.decoding)))
    return cells


__all__ = ["BelowMinimumBudget", "check_minimum_budgets", "recorded_cells"]
