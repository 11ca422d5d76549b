"""The task registry: one name -> one :class:`Benchmark` instance.

Where tasks come from, in the order a name is looked up:

1. heldout's own families (:data:`BUILTIN_FAMILIES`), imported lazily by name prefix so that one
   family's heavy imports never slow down (or break) another's;
2. plugin packages: every entry point of the group ``heldout.tasks`` names a module that registers
   its tasks at import (the entry point's name is the family prefix). A ``manifests/`` folder next
   to that module (or a ``MANIFEST_DIR`` the module defines) goes on the manifest search path;
3. user JSONL tasks frozen with ``heldout data freeze --jsonl``: a manifest on the search path
   whose source says ``{"kind": "jsonl"}`` becomes a :class:`UserJsonlTask`.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
import warnings
from importlib.metadata import entry_points
from pathlib import Path

from heldout.benchmarks.base import Benchmark
from heldout.benchmarks.user_jsonl import UserJsonlTask
from heldout.contracts import DataError, HeldoutError, RunLimits, wall_backstop
from heldout.data_manifests import Manifest, add_manifest_root, manifest_roots

ENTRY_POINT_GROUP = "heldout.tasks"


class PluginSkipped(UserWarning):
    """A task plugin that failed to load was left out of ``all_tasks()`` (the warning names it)."""


# Task-name prefix (the part before the first "/") -> the module that registers those tasks.
BUILTIN_FAMILIES: dict[str, str] = {
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
_GROUPS: dict[str, tuple[str, ...]] = {}  # named task groups a family declares (e.g. bbh/sepo)
_LOADED_PLUGINS: set[str] = set()
KIND_GROUPS = ("prompt", "program")


class UnknownTask(HeldoutError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def register(benchmark: Benchmark) -> Benchmark:
    if not benchmark.name:
        raise ValueError("a benchmark needs a name")
    _check_kind(benchmark)
    _limit_by_cpu_time(benchmark)
    existing = _TASKS.get(benchmark.name)
    if existing is not None and type(existing) is not type(benchmark):
        raise ValueError(f"task {benchmark.name!r} registered twice")
    _TASKS[benchmark.name] = benchmark
    return benchmark


def _check_kind(benchmark: Benchmark) -> None:
    """A task that defines the parts of a program task (``run``, ``helper_sources``) and none of a
    prompt task's (``render``, ``score_text``) must say ``kind = "program"``: otherwise it is treated
    as a prompt task and the first run asks for a worker model, far from the cause."""
    cls = type(benchmark)
    program = cls.run is not Benchmark.run or bool(benchmark.helper_sources)
    prompt = cls.render is not Benchmark.render or cls.score_text is not Benchmark.score_text
    if program and not prompt and benchmark.kind != "program":
        raise ValueError(f"task {benchmark.name!r} defines run()/helper_sources, the parts of a program task, "
                         f"but its kind is {benchmark.kind!r}: add kind = \"program\" to {cls.__name__}")


def _limit_by_cpu_time(benchmark: Benchmark) -> None:
    """A program task's time limit is CPU time; its wall limit only stops a program that waits
    (DESIGN "Time"). A wall limit under the backstop of the CPU limit would fail a program because
    the machine was busy: refused, naming the fix, when the task chose it; a task on the library's
    defaults gets the backstop."""
    limits = benchmark.default_limits
    if benchmark.kind != "program" or limits.wall_seconds >= wall_backstop(limits.cpu_seconds):
        return
    if limits == RunLimits():
        benchmark.default_limits = limits.replace(wall_seconds=wall_backstop(limits.cpu_seconds))
        return
    raise ValueError(f"task {benchmark.name!r} limits a program to {limits.wall_seconds:g} s of wall time, less "
                     f"than the backstop of its {limits.cpu_seconds:g} s CPU limit: its verdicts would depend on the "
                     f"machine's load. Set wall_seconds=wall_backstop(cpu_seconds) "
                     f"({wall_backstop(limits.cpu_seconds):g} s; heldout.contracts.wall_backstop) and limit the "
                     f"program by its cpu_seconds")


def register_group(name: str, tasks: list[str] | tuple[str, ...], description: str = "") -> None:
    """A named task group (``--task bbh/sepo``); its members must be tasks of the same family."""
    _GROUPS[name] = tuple(tasks)


def task_groups() -> dict[str, list[str]]:
    """Every group a name can expand from: families, declared groups, and the two kinds."""
    tasks = all_tasks()
    groups: dict[str, list[str]] = {}
    for bench in tasks:
        groups.setdefault(bench.name.split("/", 1)[0], []).append(bench.name)
    groups = {k: v for k, v in groups.items() if len(v) > 1 or v[0] != k}
    groups.update({name: list(members) for name, members in sorted(_GROUPS.items())})
    for kind in KIND_GROUPS:
        groups[kind] = [b.name for b in tasks if b.kind == kind]
    return groups


def expand_tasks(patterns: list[str]) -> list[str]:
    """Task names from names, globs (``mmlu_pro/*``), families (``bbh``), declared groups
    (``bbh/sepo``) and kinds (``program``), in order, without repeats. Unknown: a clear error."""
    out: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            names = [b.name for b in all_tasks() if fnmatch.fnmatchcase(b.name, pattern)]
            if not names:
                raise UnknownTask(f"no task matches {pattern!r}; `heldout tasks list` shows them all")
        else:
            try:
                names = [get_benchmark(pattern).name]
            except UnknownTask:
                names = task_groups().get(pattern, [])
                if not names:
                    raise
        out += [n for n in names if n not in out]
    return out


def _import_builtin(prefix: str) -> None:
    module = BUILTIN_FAMILIES.get(prefix)
    if module is not None:
        importlib.import_module(module)


@functools.lru_cache(maxsize=1)
def _plugins() -> tuple:
    # the installed entry points do not change within a process; scanning every distribution's
    # metadata on each lookup of an unknown task cost ~35 ms (a report of 250 renamed tasks: 9 s)
    return tuple(ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in BUILTIN_FAMILIES)


def _load_plugin(ep) -> None:
    """Import a ``heldout.tasks`` plugin in this process, by design: a task is the harness's own
    scoring rule (it holds the labels and judges every candidate), so a task plugin is trusted code
    the user chose by installing it in their own environment, unlike an optimizer plugin, which is
    user code under test and is never imported here (``heldout.optimizers``)."""
    if ep.name in _LOADED_PLUGINS:
        return
    _LOADED_PLUGINS.add(ep.name)
    try:
        module = importlib.import_module(ep.value.split(":")[0])
    except Exception as exc:  # a broken plugin is named, not silently skipped
        raise HeldoutError(f"task plugin {ep.name!r} ({ep.value}) failed to import: {type(exc).__name__}: {exc}") \
            from exc
    folder = getattr(module, "MANIFEST_DIR", None) or Path(module.__file__).resolve().parent / "manifests"
    if Path(folder).is_dir():
        add_manifest_root(folder)


def _user_jsonl_task(name: str) -> Benchmark | None:
    path = Manifest.find(name)
    if path is None:
        return None
    manifest = Manifest.load(name)
    source = manifest.source if isinstance(manifest.source, dict) else {}
    if source.get("kind") != "jsonl":
        return None
    task = UserJsonlTask(name, path.parent / source["file"], source.get("answer_format", "span"))
    return register(task)


def _user_manifests() -> list[str]:
    names = []
    for root in manifest_roots()[:-1]:  # heldout's own folder holds no user tasks
        for path in sorted(Path(root).rglob("*.json")) if Path(root).is_dir() else []:
            names.append(str(path.relative_to(root).with_suffix("")))
    return names


def all_tasks() -> list[Benchmark]:
    for prefix in BUILTIN_FAMILIES:
        _import_builtin(prefix)
    for ep in _plugins():
        try:
            _load_plugin(ep)
        except HeldoutError as exc:
            # one broken plugin must not hide every other task: the listing goes on without it, and
            # says which one was skipped and why (asking for one of its tasks by name still fails loudly)
            warnings.warn(f"skipped: {exc}", PluginSkipped, stacklevel=2)
    for name in _user_manifests():
        if name not in _TASKS:
            try:
                _user_jsonl_task(name)
            except DataError:
                continue
    return [_TASKS[name] for name in sorted(_TASKS)]


def get_benchmark(name: str) -> Benchmark:
    prefix = name.split("/", 1)[0]
    _import_builtin(prefix)
    if name not in _TASKS:
        for ep in _plugins():
            if ep.name == prefix:
                _load_plugin(ep)
    if name not in _TASKS:
        _user_jsonl_task(name)
    if name not in _TASKS:
        all_tasks()  # for the "did you mean" hint
    try:
        return _TASKS[name]
    except KeyError:
        close = [n for n in sorted(_TASKS) if prefix in n][:8]
        hint = f" (did you mean one of: {', '.join(close)})" if close else ""
        raise UnknownTask(f"unknown task {name!r}{hint}; `heldout tasks list` shows them all") from None
