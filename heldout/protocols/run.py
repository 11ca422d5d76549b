"""The replication runner: tasks x methods x seeds, one protected session per cell.

Layout: ``RUN_ROOT/<task, "/" as "__">/<method>/seed-<n>/`` holding ``ledger.jsonl`` and, once
finished, ``run_record.json``. Resumable: a cell with a finished record is skipped; a cell with a
ledger but no record is re-opened, and its session resumes from the ledger (spent budget stays
spent, recorded evaluations are replayed, nothing is double counted).

Cells run through an :class:`Executor`; :class:`LocalExecutor` is a process pool (``--jobs N``).
A distributed engine plugs in by implementing the same one-method interface."""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

from heldout.benchmarks.registry import expand_tasks
from heldout.contracts import HeldoutError
from heldout.evaluators.isolated import is_function_spec, run_isolated, run_isolated_function
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.evaluators.session import Budget, Session
from heldout.models import ModelClient, ResponseCache
from heldout.optimizers import resolve_optimizer


@dataclass(frozen=True)
class Method:
    """A named optimizer: in-process (``target`` = reference name or module:function) or an
    isolated command (``command`` set)."""

    name: str
    target: str | None = None
    command: str | None = None


@dataclass(frozen=True)
class Cell:
    task: str
    method: Method
    seed: int
    budget: int
    profile: str = "default"
    options: dict[str, Any] = field(default_factory=dict)
    verifier: str = "decomposed"

    def run_dir(self, root: str | Path) -> Path:
        """``<task>/<method>/seed-<n>``; a non-canonical verifier adds a level: ``<method>/verifier-<v>``."""
        method = Path(self.method.name)
        if self.verifier != "decomposed":
            method = method / f"verifier-{self.verifier.replace(':', '-').replace('+', '_')}"
        return Path(root) / self.task.replace("/", "__") / method / f"seed-{self.seed}"


class Executor(Protocol):
    """Runs cells; yields ``(cell, summary)`` as each finishes (any order)."""

    def map(self, fn: Callable[[Cell], dict[str, Any]], cells: list[Cell]) -> Iterator[tuple[Cell, dict[str, Any]]]:
        ...


class LocalExecutor:
    """A process pool on this machine (``jobs=1`` runs in this process, handy for debugging)."""

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = max(1, jobs)

    def map(self, fn, cells):
        if self.jobs == 1:
            for cell in cells:
                yield cell, fn(cell)
            return
        with ProcessPoolExecutor(max_workers=self.jobs) as pool:
            futures = {pool.submit(fn, cell): cell for cell in cells}
            for future in as_completed(futures):
                yield futures[future], future.result()


@dataclass
class StudyConfig:
    run_root: str
    data_dir: str | None = None
    allow_drift: bool = False
    policy: str = "standard"
    architect_tokens: int | None = None
    wall_seconds: float | None = None
    worker_model: str | None = None
    architect_model: str | None = None
    base_url: str | None = None
    cache_dir: str | None = None
    model_concurrency: int = 16  # endpoint calls in flight per client (a local CPU model serves one at a time)
    architect_calls: int | None = None
    trusted_optimizer: bool = False  # run module:function optimizers in-process ("trusted, not isolated")


def _client(model: str | None, config: StudyConfig):
    if not model:
        return None
    cache = ResponseCache(config.cache_dir) if config.cache_dir else None
    return ModelClient(model, base_url=config.base_url, cache=cache, concurrency=config.model_concurrency)


def run_cell(cell: Cell, config: StudyConfig) -> dict[str, Any]:
    """Run (or resume, or skip) one cell. Never raises for a failing optimizer: the record says."""
    run_dir = cell.run_dir(config.run_root)
    record_path = run_dir / RECORD_FILE
    if record_path.exists():
        record = RunRecord.load(run_dir)
        return {"status": record.status, "skipped": True, "test_score": record.test_score, "run_dir": str(run_dir)}
    session = Session(cell.task, profile=cell.profile,
                      budget=Budget(cell.budget, config.architect_tokens, config.wall_seconds, config.architect_calls),
                      seed=cell.seed, worker=_client(config.worker_model, config), run_dir=run_dir,
                      architect=_client(config.architect_model, config), policy=config.policy,
                      data_dir=config.data_dir, allow_drift=config.allow_drift, method=cell.method.name,
                      options=cell.options, verifier=cell.verifier)
    target = cell.method.target or cell.method.name
    if cell.method.command:
        record = run_isolated(session, cell.method.command)
    elif is_function_spec(target) and not config.trusted_optimizer:
        # user code: isolated by default (the trust model); heldout's reference names run in-process
        record = run_isolated_function(session, target)
    else:
        session.service.record_event("optimizer_trust", {"optimizer": target, "trusted": True,
                                                         "isolation": "trusted, not isolated"})
        record = session.run(resolve_optimizer(target))
    return {"status": record.status, "skipped": False, "test_score": record.test_score,
            "error": record.error, "run_dir": str(run_dir)}


class _CellRunner:
    """Picklable ``cell -> summary`` for process pools."""

    def __init__(self, config: StudyConfig) -> None:
        self.config = config

    def __call__(self, cell: Cell) -> dict[str, Any]:
        return run_cell(cell, self.config)


def run_study(cells: list[Cell], config: StudyConfig, executor: Executor | None = None,
              progress: bool = True) -> list[dict[str, Any]]:
    executor = executor or LocalExecutor(1)
    results = []
    bar = None
    if progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(cells), unit="cell", file=sys.stderr)
    for cell, summary in executor.map(_CellRunner(config), cells):
        results.append({"task": cell.task, "method": cell.method.name, "seed": cell.seed, **summary})
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"{cell.task} {cell.method.name} s{cell.seed}: {summary['status']}")
        elif progress:
            print(f"[{len(results)}/{len(cells)}] {cell.task} {cell.method.name} seed {cell.seed}: "
                  f"{summary['status']}{' (already done)' if summary.get('skipped') else ''} "
                  f"test {summary.get('test_score')}", file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()
    return results


def parse_methods(optimizers: Iterable[str], commands: Iterable[str]) -> list[Method]:
    """``NAME`` or ``NAME=module:function`` for in-process; ``NAME=CMD`` or ``CMD`` for commands."""
    methods = []
    for spec in optimizers:
        name, _, target = spec.partition("=")
        methods.append(Method(name=name, target=target or name))
    for k, spec in enumerate(commands):
        name, sep, command = spec.partition("=")
        if not sep or " " in name:
            name, command = f"cmd{k}", spec
        methods.append(Method(name=name, command=command))
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise HeldoutError(f"method names must be unique, got {names}")
    if not methods:
        raise HeldoutError("name at least one --optimizer or --optimizer-cmd")
    return methods


def parse_budgets(specs: Iterable[str], tasks: list[str]) -> dict[str, int]:
    """``N`` for every task, or ``TASK=N`` per task (a later spec overrides an earlier one)."""
    budgets: dict[str, int] = {}
    for spec in specs:
        task, sep, value = spec.rpartition("=")
        try:
            n = int(value)
        except ValueError:
            raise HeldoutError(f"--budget takes N or TASK=N, got {spec!r}") from None
        for t in (expand_tasks([task]) if sep else tasks):
            budgets[t] = n
    missing = [t for t in tasks if t not in budgets]
    if missing:
        raise HeldoutError(f"no budget for {', '.join(missing)}")
    return budgets


def build_cells(tasks: list[str], methods: list[Method], seeds: list[int], budgets: dict[str, int],
                profile: str, options: dict[str, Any], verifiers: list[str] | None = None) -> list[Cell]:
    return [Cell(task, method, seed, budgets[task], profile, options, verifier)
            for task in tasks for method in methods for verifier in (verifiers or ["decomposed"])
            for seed in seeds]
