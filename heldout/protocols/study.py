"""Study files: one reviewable, rerunnable TOML file for what ``heldout run`` does.

A study file names the tasks (names, families, groups, globs), split profiles, methods with
their options, seeds, budgets (per task), verifier variants, prompt format, visibility policy,
models and executor. :func:`load_study` reads it with ``read_user_toml``; :func:`parse_study` validates a
mapping; the ``heldout run`` flags are read by :func:`parse_methods`, :func:`parse_budgets` and
:func:`parse_seeds`; both end in :func:`make_study`, the one way a study is made, so a file and the
flags that say the same thing give the same cells. Rules:

* unknown keys are refused, each error is one line naming the key (``methods[1].optimizer``);
* everything is resolved before anything runs: groups and globs to task names, a budget for every
  task, every verifier spec parsed against its task, every profile present in its task's manifest
  - so ``heldout run --dry-run`` can print every cell and the total budget, and spend nothing;
* the *resolved* study (expanded, explicit, defaults filled in) is saved as ``study.toml`` in
  the run dir (:func:`save_resolved`; read back with :func:`read_resolved`), so the report and a
  reviewer see exactly what ran, and ``heldout run RUN_DIR/study.toml`` reruns it.

Example::

    run_dir = "runs/sepo"
    tasks = ["bbh/sepo"]
    seeds = [0, 1, 2]
    verifiers = ["decomposed", "scalar"]
    prompt_format = "cot_3shot"

    [budget]
    default = 400
    "bbh/word_sorting" = 800

    [models]
    worker = "qwen2.5-7b-instruct"
    architect = "qwen2.5-7b-instruct"
    base_url = "http://127.0.0.1:8000/v1"

    [[methods]]
    name = "seed"

    [[methods]]
    name = "reflective"

    [[methods]]
    name = "mine"
    command = "python my_optimizer.py"
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import tomli_w

from heldout.benchmarks.registry import expand_tasks, get_benchmark
from heldout.benchmarks.verifiers import CANONICAL, parse_verifier
from heldout.contracts import HeldoutError
from heldout.files import check_folder, check_name, check_utf8_text, read_user_toml, write_text_atomically
from heldout.data_manifests import task_manifests
from heldout.evaluators.policy import POLICIES
from heldout.evaluators.scoring import Decoding
from heldout.optimizers import (ALIASES, CODE_OPTIONS, REFERENCE_OPTIMIZERS, canonical_name, check_optimizer,
                                check_options, settings_type)
from heldout.protocols.executors import EXECUTORS
from heldout.protocols.minimum_budgets import check_minimum_budgets
from heldout.optimizers.resolved import ResolvedMethod
from heldout.protocols.run import Cell, Method, StudyConfig, build_cells

STUDY_FILE = "study.toml"
DEFAULT_PROFILE = "default"


MAX_STUDY_BYTES = 1024 * 1024  # a study file is a page of TOML; a larger one is not one


class StudyError(HeldoutError):
    """A study file (or the flags) cannot make a study: the message names the key."""


TRUST_FLAG = "--trusted-optimizer"
TRUST_VARIABLE = "HELDOUT_TRUSTED_OPTIMIZER"


def refused_trust(origin: str) -> str:
    """What a file that asks for trust is told: a shared file (a method's "reproduce our numbers"
    study) must not decide that its own optimizer runs in the harness's process."""
    return (f"{origin}: trusted_optimizer = true is refused: a file cannot grant trust; the person running "
            f"the command grants it with {TRUST_FLAG} (or {TRUST_VARIABLE}=1); nothing was run or written")


def trust_granted(flag: bool) -> bool:
    """Trust to run user code in the harness's process: the ``--trusted-optimizer`` flag, or
    ``HELDOUT_TRUSTED_OPTIMIZER=1`` in the environment of the person running the command."""
    return bool(flag) or os.environ.get(TRUST_VARIABLE, "") == "1"


# -- the schema: key -> (python types, description) per table; anything else is refused -------------
_TOP = {
    "run_dir": ((str,), "study folder (one experiment; resumable)"),
    "tasks": ((list,), "task names, families, groups or globs"),
    "profiles": ((list,), "split profiles (default [\"default\"])"),
    "seeds": ((list,), "integer seeds (default [0])"),
    "budget": ((int, dict), "metric calls per session: N, or a table {default = N, TASK = N}"),
    "methods": ((list,), "array of method names or [[methods]] tables"),
    "verifiers": ((list,), "verifier variants the optimizer sees (default [\"decomposed\"])"),
    "prompt_format": ((str,), "prompt tasks: zero_shot, cot_3shot (BBH), cot_5shot (MMLU-Pro)"),
    "policy": ((str,), "visibility policy"),
    "data_dir": ((str,), "local data mirror"),
    "allow_drift": ((bool,), "load even if the data drifted from its manifest"),
    "options": ((dict,), "task options (tolerance) and decoding (max_tokens, temperature)"),
    "limits": ((dict,), "architect_tokens, wall_seconds per session"),
    "models": ((dict,), "worker, architect, base_url, cache_dir, concurrency, timeout"),
    "executor": ((dict,), "kind = \"local\" or \"ray\", jobs, ray_address, cell_cpus, cell_memory_mb"),
    # never granted by a file: only the person running the command grants trust (refused when true)
    "trusted_optimizer": ((bool,), "refused when true: trust comes from --trusted-optimizer or "
                                   "HELDOUT_TRUSTED_OPTIMIZER=1 only"),
}
_METHOD = {"name": (str,), "optimizer": (str,), "command": (str,), "options": (dict,)}
_OPTIONS = {"tolerance": (int, float), "max_tokens": (int,), "temperature": (int, float)}
_LIMITS = {"architect_tokens": (int,), "wall_seconds": (int, float)}
_MODELS = {"worker": (str,), "architect": (str,), "base_url": (str,), "cache_dir": (str,), "concurrency": (int,),
           "timeout": (int, float)}
_EXECUTOR = {"kind": (str,), "jobs": (int,), "ray_address": (str,), "cell_cpus": (int, float),
             "cell_memory_mb": (int,)}


@dataclass
class Study:
    """A resolved study: every name expanded, every default filled in. ``cells()`` are the sessions
    it runs; ``config`` is shared by all of them; a study over several profiles keeps each
    profile's sessions under ``run_dir/profile-<name>`` so their run dirs never collide."""

    run_dir: str
    tasks: list[str]
    profiles: list[str]
    seeds: list[int]
    budgets: dict[str, int]
    methods: list[Method]
    verifiers: list[str]
    options: dict[str, Any]
    config: StudyConfig
    executor: dict[str, Any] = field(default_factory=dict)  # kind, jobs, ray_address, cell_cpus, cell_memory_mb
    # method name -> what it runs (target, code and hash, isolation, trust), decided once per study
    decided: dict[str, ResolvedMethod] = field(default_factory=dict, repr=False, compare=False)

    def decide_methods(self) -> dict[str, ResolvedMethod]:
        """Each method's one decided value (:meth:`~heldout.protocols.run.Method.resolve`), made once
        with the trust the person granted (made again only if that changed, as when the command's
        flag is applied to a study read from a file)."""
        trusted = self.config.trusted_optimizer
        if len(self.decided) != len(self.methods) or any(d.trusted != trusted for d in self.decided.values()):
            self.decided = {m.name: m.resolve(trusted) for m in self.methods}
        return self.decided

    def groups(self) -> list[tuple[StudyConfig, list[Cell]]]:
        """``(config, cells)`` per profile, each config's ``run_root`` where its cells live."""
        out = []
        decided = self.decide_methods()
        for profile in self.profiles:
            root = self.run_dir if len(self.profiles) == 1 else str(Path(self.run_dir) / f"profile-{profile}")
            config = StudyConfig(**{**asdict(self.config), "run_root": root})
            out.append((config, build_cells(self.tasks, self.methods, self.seeds, self.budgets, profile,
                                            self.options, self.verifiers, decided)))
        return out

    def cells(self) -> list[Cell]:
        return [cell for _, cells in self.groups() for cell in cells]

    def total_metric_calls(self) -> int:
        return sum(cell.budget for cell in self.cells())

    def plan(self) -> list[str]:
        """One line per cell and the totals: what ``--dry-run`` prints before anything is spent."""
        lines = [f"{'task':<40} {'profile':<12} {'method':<20} {'verifier':<14} {'seed':>4} {'budget':>7}  run dir"]
        for config, cells in self.groups():
            for c in cells:
                lines.append(f"{c.task:<40} {c.profile:<12} {c.method.name:<20} {c.verifier:<14} {c.seed:>4} "
                             f"{c.budget:>7}  {c.run_dir(config.run_root)}")
        n = len(self.cells())
        lines.append(f"{n} cell(s); total budget {self.total_metric_calls()} metric calls"
                     + (f", {n * self.config.architect_tokens} architect tokens" if self.config.architect_tokens else "")
                     + (f", {n * self.config.wall_seconds:g} wall seconds" if self.config.wall_seconds else "")
                     + f"; executor {self.executor['kind']}, {self.executor['jobs']} job(s)")
        return lines

    def resolved(self) -> dict[str, Any]:
        """The study as a study file with nothing left implicit (``None`` values are left out,
        TOML has no null); parsing it again gives the same study."""
        methods = []
        for m in self.methods:
            entry: dict[str, Any] = {"name": m.name}
            if m.command:
                entry["command"] = m.command
            else:
                entry["optimizer"] = m.target or m.name
            if m.options:
                entry["options"] = dict(m.options)
            methods.append(entry)
        data: dict[str, Any] = {
            "run_dir": self.run_dir, "tasks": list(self.tasks), "profiles": list(self.profiles),
            "seeds": list(self.seeds), "verifiers": list(self.verifiers), "policy": self.config.policy,
            "allow_drift": self.config.allow_drift, "data_dir": self.config.data_dir,
            "prompt_format": self.options.get("prompt_format"),
            "budget": dict(self.budgets),
            "options": {k: v for k, v in self.options.items() if k != "prompt_format"},
            "limits": {"architect_tokens": self.config.architect_tokens, "wall_seconds": self.config.wall_seconds},
            "models": {"worker": self.config.worker_model, "architect": self.config.architect_model,
                       "base_url": self.config.base_url, "cache_dir": self.config.cache_dir,
                       "concurrency": self.config.model_concurrency, "timeout": self.config.model_timeout},
            "executor": dict(self.executor),
            "methods": methods,
        }
        return _drop_none(data)


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        cleaned = {k: _drop_none(v) for k, v in value.items() if v is not None}
        return {k: v for k, v in cleaned.items() if v != {}}
    return value


# -- parsing -----------------------------------------------------------------------------------------
def load_study(path: str | Path, *, run_dir: str | None = None) -> Study:
    """Read and resolve a study file; ``run_dir`` (the ``--run-dir`` flag) overrides the file's.
    The study heldout saved in a run dir (:func:`save_resolved`) is that run dir's from any folder
    (the ``run_dir`` it states is relative to the first run's folder: from another, a new study)."""
    path = Path(path)
    data = read_user_toml(path, "study file", max_bytes=MAX_STUDY_BYTES, error=StudyError)
    if run_dir is not None:
        data["run_dir"] = run_dir
    elif path.name == STUDY_FILE and path.read_bytes().startswith(RESOLVED_HEADER.encode()):  # saved by heldout
        data["run_dir"] = str(path.parent)
    return parse_study(data, origin=str(path))


def parse_study(data: Mapping[str, Any], origin: str = "study") -> Study:
    """Validate a study file's mapping key by key, then make the study it says (:func:`make_study`)."""
    _check_keys(data, _TOP, "", origin)
    for key, (types, _) in _TOP.items():
        if key in data:
            _check_type(data[key], types, key, origin)
    if data.get("trusted_optimizer"):
        raise StudyError(refused_trust(origin))

    def need(key: str) -> Any:
        if key not in data:
            raise StudyError(f"{origin}: missing key {key!r} ({_TOP[key][1]})")
        return data[key]

    run_dir = need("run_dir")
    tasks = _task_list(need("tasks"), origin)
    profiles = _str_list(data.get("profiles", [DEFAULT_PROFILE]), "profiles", origin, unique=True)
    seeds = _int_list(data.get("seeds", [0]), "seeds", origin)
    budgets = _budgets(need("budget"), tasks, origin)
    methods = _methods(need("methods"), origin)
    verifiers = _str_list(data.get("verifiers", [CANONICAL]), "verifiers", origin, unique=True)
    options = dict(_table(data.get("options", {}), _OPTIONS, "options", origin))
    if "prompt_format" in data:
        options["prompt_format"] = data["prompt_format"]
    return make_study(run_dir=run_dir, tasks=tasks, profiles=profiles, seeds=seeds, budgets=budgets,
                      methods=methods, verifiers=verifiers, policy=data.get("policy", "standard"), options=options,
                      limits=_table(data.get("limits", {}), _LIMITS, "limits", origin),
                      models=_table(data.get("models", {}), _MODELS, "models", origin),
                      executor=_table(data.get("executor", {}), _EXECUTOR, "executor", origin),
                      data_dir=data.get("data_dir"), allow_drift=data.get("allow_drift", False),
                      trusted_optimizer=False, origin=origin)


def make_study(*, run_dir: str, tasks: list[str], budgets: dict[str, int], methods: list[Method],
               profiles: list[str], seeds: list[int], verifiers: list[str], policy: str,
               options: dict[str, Any], limits: Mapping[str, Any], models: Mapping[str, Any],
               executor: Mapping[str, Any], data_dir: str | None, allow_drift: bool, trusted_optimizer: bool,
               origin: str) -> Study:
    """The one way a :class:`Study` is made, from plain values each already in its own syntax (a
    study file's through :func:`parse_study`, the ``heldout run`` flags' through
    :func:`parse_methods`, :func:`parse_budgets`, :func:`parse_seeds`): the values are checked
    against each other and against the tasks' manifests, and the executor's defaults filled in."""
    run_dir = check_folder(run_dir, f"{origin}: run_dir", error=StudyError)
    if policy not in POLICIES:
        raise StudyError(f"{origin}: policy {policy!r} is not one of {', '.join(sorted(POLICIES))}")
    executor = {"kind": "local", "jobs": 1, "cell_cpus": None, **executor}  # None: what a cell uses
    if executor["kind"] not in EXECUTORS:
        raise StudyError(f"{origin}: executor.kind {executor['kind']!r} is not one of {', '.join(EXECUTORS)}")
    if executor["jobs"] < 1:
        raise StudyError(f"{origin}: executor.jobs must be >= 1, got {executor['jobs']}")
    _check_against_tasks(tasks, profiles, verifiers, options, origin)
    try:  # the decoding settings among the options are split from them where the cells are made (build_cells)
        Decoding.split(options)
    except HeldoutError as exc:
        raise StudyError(f"{origin}: options: {exc}") from None
    # a run below it is the seed; one seed per cell stands for all (they share the budget)
    check_minimum_budgets([cell for profile in profiles for cell in build_cells(
        tasks, methods, seeds[:1], budgets, profile, options, verifiers)], origin)
    config = StudyConfig(run_root=run_dir, data_dir=data_dir, allow_drift=allow_drift,
                         policy=policy, architect_tokens=limits.get("architect_tokens"),
                         wall_seconds=limits.get("wall_seconds"), worker_model=models.get("worker"),
                         architect_model=models.get("architect"), base_url=models.get("base_url"),
                         cache_dir=models.get("cache_dir"), trusted_optimizer=trusted_optimizer,
                         **({"model_concurrency": models["concurrency"]} if "concurrency" in models else {}),
                         **({"model_timeout": float(models["timeout"])} if "timeout" in models else {}))
    study = Study(run_dir=run_dir, tasks=tasks, profiles=profiles, seeds=seeds, budgets=budgets, methods=methods,
                  verifiers=verifiers, options=options, config=config, executor=executor)
    # what it records: a --data-dir or --optimizer-cmd of bytes not UTF-8 failed writing study.toml
    check_utf8_text(study.resolved(), origin, error=StudyError)
    return study


# -- the flags' syntax: methods, budgets and seeds as typed on a command line ----------------------
def parse_methods(optimizers: Iterable[str], commands: Iterable[str]) -> list[Method]:
    """``NAME`` or ``NAME=module:function`` for in-process; ``NAME=CMD`` or ``CMD`` for commands.
    Reference aliases are shown under their one name; every target is checked here (user code
    read, not run: :func:`~heldout.optimizers.check_optimizer`), so a mistyped name fails before
    any session starts."""
    methods = []
    for spec in optimizers:
        # NAME=TARGET names a method; a bare spec (options after "?" may hold "=") names itself
        explicit = "=" in spec.partition("?")[0]
        name, _, target = spec.partition("=") if explicit else (canonical_name(spec), "", "")
        target = target or name
        if not name:
            raise HeldoutError(f"--optimizer needs a name, got {spec!r}")
        check_optimizer(target)
        methods.append(Method(name=name, target=target))
    for k, spec in enumerate(commands):
        name, sep, command = spec.partition("=")
        if not sep or " " in name:
            name, command = f"cmd{k}", spec
        methods.append(Method(name=name, command=command))
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        aliased = [f"{a} is an alias of {c}" for a, c in ALIASES.items() if c in names]
        raise HeldoutError(f"method names must be unique, got {names}" + (f" ({'; '.join(aliased)})" if aliased else ""))
    if not methods:
        raise HeldoutError("name at least one --optimizer or --optimizer-cmd "
                           f"(reference optimizers: {', '.join(REFERENCE_OPTIMIZERS)})")
    return methods


def parse_method_options(methods: list[Method], specs: Iterable[str]) -> list[Method]:
    """``--method-option NAME.KEY=VALUE`` (repeatable): option ``KEY`` of method ``NAME``, read as
    a study file's ``options`` are (a field of a library adapter's settings, ``width``,
    ``stream``, ``program``: :func:`~heldout.optimizers.check_options`) and checked against the
    optimizer before any session starts; the methods with their options set, in order."""
    by_name = {m.name: m for m in methods}
    given: dict[str, dict[str, str]] = {}
    for spec in specs:
        left, sep, value = spec.partition("=")
        name, dot, key = left.rpartition(".")
        if not sep or not dot or not name or not key:
            raise HeldoutError(f"--method-option takes NAME.KEY=VALUE, got {spec!r}")
        if name not in by_name:
            raise HeldoutError(f"--method-option {spec!r}: no method named {name!r} (methods: {', '.join(by_name)})")
        if by_name[name].command is not None:
            raise HeldoutError(f"--method-option {spec!r}: {name} is a command; give its options on its command line")
        given.setdefault(name, {})[key] = value
    out = []
    for method in methods:
        if method.name in given:
            target = method.target or method.name
            options = {**method.options, **check_options(given[method.name], f"--method-option {method.name}",
                                                         settings_type(target))}
            check_optimizer(target, options)
            method = dataclasses.replace(method, options=options)
        out.append(method)
    return out


def parse_budgets(specs: Iterable[str], tasks: list[str]) -> dict[str, int]:
    """``N`` for every task, or ``TASK=N`` per task (a later spec overrides an earlier one).
    N must be a whole number >= 1."""
    budgets: dict[str, int] = {}
    strangers: list[str] = []
    for spec in specs:
        task, sep, value = spec.rpartition("=")
        try:
            n = int(value)
        except ValueError:
            n = None
        if n is None or n < 1:
            raise HeldoutError(f"--budget takes N or TASK=N with N a whole number >= 1 (metric calls), got {spec!r}")
        named = expand_tasks([task]) if sep else tasks
        if sep and not set(named) & set(tasks):
            strangers.append(spec)
        for t in named:
            budgets[t] = n
    missing = [t for t in tasks if t not in budgets]
    if missing:
        raise HeldoutError(f"no budget for {', '.join(missing)}")
    if strangers:
        raise HeldoutError(f"--budget {', '.join(map(repr, strangers))} names no task of this run ({', '.join(tasks)})")
    return {t: budgets[t] for t in tasks}


def parse_seeds(text: str) -> list[int]:
    """``0,1,2``: distinct whole numbers >= 0."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        seeds = None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise HeldoutError(f"--seeds takes distinct whole numbers >= 0 separated by commas (e.g. 0,1,2), got {text!r}")
    return seeds


def _check_keys(table: Mapping[str, Any], allowed: Mapping[str, Any], where: str, origin: str) -> None:
    for key in table:
        if key not in allowed:
            raise StudyError(f"{origin}: unknown key {where + key!r} (allowed: {', '.join(allowed)})")


def _check_type(value: Any, types: tuple[type, ...], key: str, origin: str) -> None:
    # bool is an int in Python; a TOML `true` is never a count
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        names = " or ".join({"str": "a string", "int": "an integer", "float": "a number", "bool": "true/false",
                             "list": "an array", "dict": "a table"}[t.__name__] for t in types)
        raise StudyError(f"{origin}: {key} must be {names}, got {value!r}")


def _table(value: Mapping[str, Any], schema: Mapping[str, tuple[type, ...]], name: str, origin: str) -> dict[str, Any]:
    _check_keys(value, schema, f"{name}.", origin)
    for key, item in value.items():
        _check_type(item, schema[key], f"{name}.{key}", origin)
    return dict(value)


def _str_list(value: list[Any], key: str, origin: str, unique: bool = False) -> list[str]:
    for k, item in enumerate(value):
        _check_type(item, (str,), f"{key}[{k}]", origin)
    if not value:
        raise StudyError(f"{origin}: {key} is empty")
    if unique and len(set(value)) != len(value):
        raise StudyError(f"{origin}: {key} repeats an entry: {value}")
    return list(value)


def _int_list(value: list[Any], key: str, origin: str) -> list[int]:
    for k, item in enumerate(value):
        _check_type(item, (int,), f"{key}[{k}]", origin)
    if not value:
        raise StudyError(f"{origin}: {key} is empty")
    if len(set(value)) != len(value):
        raise StudyError(f"{origin}: {key} repeats a seed ({value}): each seed is one run")
    return list(value)


def _task_list(value: list[Any], origin: str) -> list[str]:
    patterns = _str_list(value, "tasks", origin)
    try:
        return expand_tasks(patterns)
    except HeldoutError as exc:
        raise StudyError(f"{origin}: tasks: {exc}") from None


def _budgets(value: int | Mapping[str, Any], tasks: list[str], origin: str) -> dict[str, int]:
    table = {"default": value} if isinstance(value, int) else dict(value)
    specs = []
    for key, n in table.items():
        _check_type(n, (int,), "budget" if isinstance(value, int) else f"budget.{key!r}", origin)
        if n < 1:
            raise StudyError(f"{origin}: budget{'' if isinstance(value, int) else '.' + repr(key)} must be >= 1, got {n}")
    if "default" in table:
        specs.append(str(table["default"]))
    for key, n in table.items():  # per-task entries override the default, in file order
        if key != "default":
            try:
                expand_tasks([key])
            except HeldoutError as exc:
                raise StudyError(f"{origin}: budget.{key!r}: {exc}") from None
            specs.append(f"{key}={n}")
    try:
        budgets = parse_budgets(specs, tasks)
    except HeldoutError as exc:
        raise StudyError(f"{origin}: budget: {exc} (add budget.default or a per-task entry)") from None
    return {task: budgets[task] for task in tasks}


def _methods(value: list[Any], origin: str) -> list[Method]:
    if not value:
        raise StudyError(f"{origin}: methods is empty (name at least one [[methods]])")
    methods = []
    for k, entry in enumerate(value):
        where = f"methods[{k}]"
        if isinstance(entry, str):  # methods = ["seed", "local-search"]: a plain name is {name = "seed"}
            entry = {"name": entry}
        _check_type(entry, (dict,), where, origin)
        _check_keys(entry, _METHOD, f"{where}.", origin)
        for key, item in entry.items():
            _check_type(item, _METHOD[key], f"{where}.{key}", origin)
        if "name" not in entry:
            raise StudyError(f"{origin}: missing key '{where}.name'")
        if "optimizer" in entry and "command" in entry:
            raise StudyError(f"{origin}: {where} has both optimizer and command (one method is one or the other)")
        if "command" in entry and entry.get("options"):
            raise StudyError(f"{origin}: {where}.options: an isolated command takes its options on its command line")
        name = check_name(entry["name"], f"{origin}: {where}.name", error=StudyError)
        try:  # user code named by an option (a DSPy program) must be module:function before it runs isolated
            check_options({k: v for k, v in entry.get("options", {}).items() if k in CODE_OPTIONS}, where)
        except HeldoutError as exc:
            raise StudyError(f"{origin}: {where}.options: {exc}") from None
        methods.append(Method(name=name, target=None if "command" in entry else entry.get("optimizer", name),
                              command=entry.get("command"), options=dict(entry.get("options", {}))))
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise StudyError(f"{origin}: method names must be unique, got {names}")
    for m in methods:
        if m.command is None:
            check_optimizer(m.target or m.name, m.options)  # a mistyped name fails before anything is written
    return methods


def _check_against_tasks(tasks: list[str], profiles: list[str], verifiers: list[str], options: Mapping[str, Any],
                         origin: str) -> None:
    """Fail now, not three hours in: every profile exists for every task, every verifier spec
    parses for every task, the prompt format is one the task knows."""
    for task in tasks:
        bench = get_benchmark(task)
        try:
            known = {name for manifest in task_manifests(bench.name) for name in manifest.profiles}
        except HeldoutError as exc:
            raise StudyError(f"{origin}: tasks: {task}: {exc}") from None
        for profile in profiles:
            if profile not in known:
                raise StudyError(f"{origin}: profiles: {task} has no profile {profile!r} "
                                 f"(it has {', '.join(sorted(known))})")
        for spec in verifiers:
            try:
                parse_verifier(spec, bench.verifier_options, bench.score_ceiling)
            except HeldoutError as exc:
                raise StudyError(f"{origin}: verifiers: {spec!r} for {task}: {exc}") from None
        check = getattr(bench, "check_prompt_format", None)
        if "prompt_format" in options and bench.kind == "prompt" and check is not None:
            try:
                check(options["prompt_format"])
            except HeldoutError as exc:
                raise StudyError(f"{origin}: prompt_format: {task}: {exc}") from None


# -- the resolved study in the run dir ---------------------------------------------------------------
RESOLVED_HEADER = "# heldout study, resolved: every group expanded, every default explicit.\n"


def to_toml(study: Study) -> str:
    return (RESOLVED_HEADER + "# Rerun exactly with: heldout run <this file> (from any folder: the run dir is this "
            "file's folder)\n" + tomli_w.dumps(study.resolved()))


def save_resolved(study: Study) -> Path:
    """Write ``run_dir/study.toml``. A rerun into the same run dir must resolve to the same study
    (resuming is only sound for the same cells): a different one is refused."""
    path = Path(study.run_dir) / STUDY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    text = to_toml(study)
    if path.exists():
        previous = read_resolved(path.parent)
        if previous is not None and _comparable(previous) != _comparable(study.resolved()):
            raise StudyError(f"{path} holds a different study; use another run dir, or rerun it with "
                             f"`heldout run {path}`")
    write_text_atomically(path, text)
    return path


def _comparable(resolved: Mapping[str, Any]) -> dict[str, Any]:
    # how many jobs run in parallel, where the cache lives, at which address the models answer (they
    # are named; StudyConfig.experiment says the same) and how the run dir's path is written change no result
    data = {k: v for k, v in resolved.items() if k not in ("executor", "run_dir")}
    data["models"] = {k: v for k, v in resolved.get("models", {}).items()
                      if k not in ("cache_dir", "concurrency", "base_url", "timeout")}
    return data


def read_resolved(run_dir: str | Path) -> dict[str, Any] | None:
    """The resolved study saved in ``run_dir`` (a study's root), or None when there is none."""
    path = Path(run_dir) / STUDY_FILE
    if not path.is_file():
        return None
    return read_user_toml(path, "the resolved study", max_bytes=MAX_STUDY_BYTES, error=StudyError)


def find_resolved_studies(paths: list[str | Path]) -> list[tuple[Path, dict[str, Any]]]:
    """Every resolved ``study.toml`` at or under ``paths``, or, for a path inside a study, the
    nearest one above it (the study root; a further one up is some other file): what a report
    shows as "the study that ran"."""
    found: dict[Path, dict[str, Any]] = {}
    for raw in paths:
        root = Path(raw).resolve()
        candidates = list(root.rglob(STUDY_FILE)) if root.is_dir() else []
        candidates += [p / STUDY_FILE for p in root.parents if (p / STUDY_FILE).is_file()][:1]
        for path in candidates:
            path = path.resolve()
            if path not in found:
                data = read_resolved(path.parent)
                if data is not None:
                    found[path] = data
    return sorted(found.items())


__all__ = ["STUDY_FILE", "Study", "StudyError", "find_resolved_studies", "load_study", "parse_study",
           "read_resolved", "save_resolved", "to_toml"]
