"""The task registry: one name -> one :class:`Benchmark` instance.

Family modules register their tasks at import time; the registry imports them lazily so that
``heldout tasks list`` does not pay for modules it does not need until asked."""

from __future__ import annotations

import importlib

from heldout.contracts import HeldoutError
from heldout.benchmarks.base import Benchmark

# Task-name prefix (the part before the first "/") -> the module that registers those tasks.
# Adding a family = adding its prefix here (and its manifests). Only the module a name needs is
# imported, so one family's heavy imports never slow down (or break) another's.
FAMILY_MODULES: dict[str, str] = {
    "bbh": "heldout.benchmarks.bbh",
    "mmlu_pro": "heldout.benchmarks.mmlu_pro",
    "mbpp_plus": "heldout.benchmarks.mbpp_plus",
    "gsm_hard": "heldout.benchmarks.gsm_hard",
    "hotpotqa": "heldout.benchmarks.hotpotqa",
    "circle_packing": "heldout.benchmarks.geometry",
    "heilbronn": "heldout.benchmarks.geometry",
    "minmax": "heldout.benchmarks.geometry",
    "autocorrelation": "heldout.benchmarks.geometry",
    "lockpicking": "heldout.benchmarks.lockpicking",
    "vliw": "heldout.benchmarks.vliw",
}

_TASKS: dict[str, Benchmark] = {}


class UnknownTask(HeldoutError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def register(benchmark: Benchmark) -> Benchmark:
    if not benchmark.name:
        raise ValueError("a benchmark needs a name")
    existing = _TASKS.get(benchmark.name)
    if existing is not None and type(existing) is not type(benchmark):
        raise ValueError(f"task {benchmark.name!r} registered twice")
    _TASKS[benchmark.name] = benchmark
    return benchmark


def _import_family(prefix: str) -> None:
    module = FAMILY_MODULES.get(prefix)
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:  # a missing dependency inside the family is a real error
            raise


def all_tasks() -> list[Benchmark]:
    for prefix in FAMILY_MODULES:
        _import_family(prefix)
    return [_TASKS[name] for name in sorted(_TASKS)]


def get_benchmark(name: str) -> Benchmark:
    _import_family(name.split("/", 1)[0])
    if name not in _TASKS:
        all_tasks()  # for the "did you mean" hint
    try:
        return _TASKS[name]
    except KeyError:
        close = [n for n in sorted(_TASKS) if name.split("/")[0] in n][:8]
        hint = f" (did you mean one of: {', '.join(close)})" if close else ""
        raise UnknownTask(f"unknown task {name!r}{hint}; `heldout tasks list` shows them all") from None
