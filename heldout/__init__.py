"""heldout: benchmarks and evaluation protocols for optimizers of prompts and programs.

The names below are loaded when first used (PEP 562), so ``import heldout.cli`` or
``heldout.contracts`` does not pay for the HTTP client, the sessions and the task registry."""

from __future__ import annotations

import importlib
import os
import sys

# When heldout is the program (the console script, or ``python -m heldout`` while -m finds it), a
# user's folder on the import path (-m's working directory, ``PYTHONPATH=.``) must not supply the
# modules the harness imports next: a ``typing.py`` there would run as the harness, key in reach.
# Only modules Python loaded at start-up are imported above this line. As a library, the path is
# the importer's own business and is left alone.
if sys.argv and (sys.argv[0] == "-m" or os.path.basename(sys.argv[0]) == "heldout"):
    _cwd = os.path.realpath(os.getcwd())
    sys.path[:] = [entry for entry in sys.path if entry not in ("", ".") and os.path.realpath(entry) != _cwd]

__version__ = "0.1.0"

_HOME = {
    "heldout.contracts": ("BudgetExceeded", "Candidate", "DataError", "Example", "HeldoutError", "InfrastructureFailure",
                          "MalformedCandidate", "RunLimits", "TaskView", "Verdict", "VisibilityError",
                          "candidate_id"),
    "heldout.benchmarks.base": ("Benchmark",),
    "heldout.benchmarks.loading": ("Task", "load_task"),
    "heldout.benchmarks.registry": ("all_tasks", "get_benchmark"),
    "heldout.data_manifests": ("DriftError",),
    "heldout.evaluators.records": ("RunRecord",),
    "heldout.evaluators.policy": ("Budget", "VisibilityPolicy"),
    "heldout.evaluators.scoring": ("Decoding", "Execution", "SessionModels"),
    "heldout.evaluators.session": ("Session",),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'heldout' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])
