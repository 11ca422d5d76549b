"""The task registry: one name -> one :class:`Benchmark` instance.

Family modules register their tasks at import time; the registry imports them lazily so that
``heldout tasks list`` does not pay for modules it does not need until asked."""

from __future__ import annotations

import importlib

from heldout.benchmarks.base import Benchmark, HeldoutError

# Adding a family = adding its module name here (and a manifest folder).
FAMILY_MODULES: tuple[str, ...] = (
    "heldout.benchmarks.bbh",
    "heldout.benchmarks.mmlu_pro",
    "heldout.benchmarks.mbpp_plus",
    "heldout.benchmarks.gsm_hard",
    "heldout.benchmarks.hotpotqa",
)

_TASKS: dict[str, Benchmark] = {}
_loaded = False


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


def _load_families() -> None:
    global _loaded
    if not _loaded:
        for module in FAMILY_MODULES:
            importlib.import_module(module)
        _loaded = True


def all_tasks() -> list[Benchmark]:
    _load_families()
    return [_TASKS[name] for name in sorted(_TASKS)]


def get_benchmark(name: str) -> Benchmark:
    _load_families()
    try:
        return _TASKS[name]
    except KeyError:
        close = [n for n in sorted(_TASKS) if name.split("/")[0] in n][:8]
        hint = f" (did you mean one of: {', '.join(close)})" if close else ""
        raise UnknownTask(f"unknown task {name!r}{hint}; `heldout tasks list` shows them all") from None
