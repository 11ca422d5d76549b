"""The replication runner: tasks x methods x seeds, one protected session per cell.

Layout: ``RUN_ROOT/study.json`` (the study's settings) and
``RUN_ROOT/<task, "/" as "__">/<method>/seed-<n>/`` holding ``ledger.jsonl`` and, once finished,
``run_record.json``.

One run dir = one experiment:

* :func:`~heldout.protocols.study_dir.open_study` writes ``study.json`` once; re-opening the dir
  with other settings is an :class:`~heldout.evaluators.same_experiment.ExperimentMismatch` naming the
  differing settings, and an existing study is continued only when asked (``resume=True``,
  ``heldout run --resume``); what a study needs to run is checked before that, writing nothing
  (:func:`~heldout.protocols.preflight.check_infrastructure`);
* a cell with a finished record is skipped only when the record is of the same experiment;
  a cell with a ledger but no record is re-opened and its session resumes from the ledger (spent
  budget stays spent, recorded evaluations are replayed faithfully, nothing is double counted);
  the session itself refuses a ledger that another experiment started. Nothing is overwritten.

Interrupts: SIGINT/SIGTERM stop the study promptly: no new cell starts, running sessions stop
at a consistent ledger point (every acknowledged entry is durable; the cell is resumable), and a
summary says what finished and how to resume. While a cell's thread only waits (on an isolated
optimizer, or on the scoring of an evaluation or of the held-out splits) the stop is raised at once.

Errors are not scores: a cell whose infrastructure failed (an endpoint that died, timed out or
answered 5xx after retries, a sandbox that could not start, a full disk) ends ``incomplete``: no
run record, a ledger that says why, and ``--resume`` finishes exactly what is missing.

Cells run through an :class:`Executor`; :class:`LocalExecutor` is a process pool (``--jobs N``).
A distributed engine plugs in by implementing the same interface."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import shlex
import shutil
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from heldout.contracts import HeldoutError, InfrastructureFailure, canonical_json
from heldout.files import check_folder, check_name
from heldout.evaluators.isolated import command_files, launch_isolated, method_launch
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.evaluators.same_experiment import ExperimentMismatch
from heldout.evaluators.policy import POLICIES, Budget
from heldout.evaluators.scoring import Decoding, SessionModels, refuse_decoding_among
from heldout.evaluators.session import Outcome, Session
from heldout.models import ModelClient, ResponseCache
from heldout.models.probe import check_endpoints
from heldout.optimizers import resolve_optimizer
from heldout.optimizers.resolved import ResolvedMethod, resolve_method
from heldout.protocols.progress import Progress


class StudyInterrupted(BaseException):
    """Raised inside a running cell by SIGINT/SIGTERM. A BaseException (like KeyboardInterrupt)
    so no optimizer's ``except Exception`` swallows it; the cell's ledger stays resumable."""


def check_command(command: Any) -> list[str]:
    """The words of an isolated optimizer's command line, checked before anything is written:
    text without NUL or control characters, quoting that closes, at least one word, and a
    program that exists as an executable file (a path, or a name on $PATH)."""
    if not isinstance(command, str) or any(ord(c) < 32 and c != "\t" or ord(c) == 127 for c in command):
        raise HeldoutError(f"optimizer command {command!r} must be one line of text (no NUL, newline or "
                           "control character)")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise HeldoutError(f"optimizer command {command!r} cannot be split into words: {exc}") from None
    if not argv:
        raise HeldoutError("the optimizer command is empty: give the program to run, e.g. "
                           "--optimizer-cmd 'python my_optimizer.py'")
    program = argv[0]
    found = program if "/" in program else shutil.which(program)
    if found is None or not os.path.isfile(found):
        where = "no such file" if "/" in program else "not found on $PATH"
        raise HeldoutError(f"optimizer command {command!r}: program {program!r} is {where}")
    if not os.access(found, os.X_OK):
        raise HeldoutError(f"optimizer command {command!r}: program {program!r} is not executable")
    command_files(argv)  # its files go into the sandbox: no symlink, no special file
    return argv


@dataclass(frozen=True)
class Method:
    """A named optimizer: in-process (``target`` = reference name or module:function) or an
    isolated command (``command`` set). ``options`` are keyword arguments of an in-process
    optimizer function (``optimize(view, seed, **options)``)."""

    name: str
    target: str | None = None
    command: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the name becomes a folder of every run dir: an allow-list, so no newline, NUL, slash,
        # "..", space or control character from a study file or a flag can reach the file system
        check_name(self.name, "method name")
        if self.command is not None:
            check_command(self.command)

    def resolve(self, trusted: bool = False) -> ResolvedMethod:
        """What this method runs, decided once (:func:`~heldout.optimizers.resolved.resolve_method`):
        target, options, the user's code found by path and its hash, isolation and trust."""
        return resolve_method(self.name, self.target, self.command, self.options, trusted=trusted)

    def describe(self) -> dict[str, Any]:
        """Name and a hash of the code that will run (the optimizer's source file, or the
        command line plus the files it names)."""
        return self.resolve().describe()


@dataclass(frozen=True)
class Cell:
    task: str
    method: Method
    seed: int
    budget: int
    profile: str = "default"
    options: dict[str, Any] = field(default_factory=dict)  # the task options
    verifier: str = "decomposed"
    # what the method runs, decided when the study was made (None: decided when the cell runs)
    resolved: ResolvedMethod | None = field(default=None, compare=False, repr=False)
    decoding: Decoding = Decoding()  # how the session's models decode

    def __post_init__(self) -> None:  # split once where cells are made (build_cells), never again downstream
        refuse_decoding_among(self.options, "cell options")

    def run_dir(self, root: str | Path) -> Path:
        """``<task>/<method>/seed-<n>``; a non-canonical verifier adds a level: ``<method>/verifier-<v>``."""
        method = Path(self.method.name)
        if self.verifier != "decomposed":
            method = method / f"verifier-{self.verifier.replace(':', '-').replace('+', '_')}"
        return Path(root) / self.task.replace("/", "__") / method / f"seed-{self.seed}"

    @property
    def label(self) -> str:
        verifier = "" if self.verifier == "decomposed" else f" [{self.verifier}]"
        return f"{self.task} {self.method.name}{verifier} seed {self.seed}"


class Executor(Protocol):
    """Runs cells; yields ``(cell, summary)`` as each finishes (any order). ``stop()`` (called
    from a signal handler) means: start no further cell and interrupt the running ones."""

    def map(self, fn: Callable[[Cell], dict[str, Any]], cells: list[Cell]) -> Iterator[tuple[Cell, dict[str, Any]]]:
        ...

    def stop(self) -> None:
        ...


_WORKER_EVENTS: Any = None  # the progress queue of a pool worker (set by _worker_init)
# Where a running cell stops. In-process optimizers stop at the next safe point: the end of an
# evaluate() call, when every result it produced is in the ledger (an asynchronous exception
# could land between a ledger write and its fsync). An isolated optimizer's harness only waits
# for its child (the view server's thread writes the ledger), so it is interrupted at once.
_STOP = threading.Event()
_WAITING = False        # this process's main thread only waits (isolated optimizer, scoring)
_INTERRUPTED = False    # a StudyInterrupted was already raised in this process


def _request_stop(signum) -> None:
    global _INTERRUPTED
    _STOP.set()
    if _WAITING and not _INTERRUPTED:  # only once: a second signal must not break the cleanup
        _INTERRUPTED = True
        raise StudyInterrupted(signal.Signals(signum).name)


def _worker_signal(signum, frame) -> None:
    _request_stop(signum)


def _checkpoint() -> None:
    """Raise :class:`StudyInterrupted` at a safe point when a stop was requested."""
    global _INTERRUPTED
    if _STOP.is_set() and not _INTERRUPTED and threading.current_thread() is threading.main_thread():
        _INTERRUPTED = True
        raise StudyInterrupted("stop requested")


def _worker_init(events) -> None:
    global _WORKER_EVENTS
    _WORKER_EVENTS = events
    signal.signal(signal.SIGINT, _worker_signal)
    signal.signal(signal.SIGTERM, _worker_signal)


class LocalExecutor:
    """A process pool on this machine (``jobs=1`` runs in this process, handy for debugging).
    At most ``jobs`` cells are handed out at a time, so after :meth:`stop` none starts."""

    def __init__(self, jobs: int = 1) -> None:
        if not isinstance(jobs, int) or jobs < 1:
            raise HeldoutError(f"--jobs must be a whole number >= 1, got {jobs!r}")
        self.jobs = jobs
        self.stopping = False
        self._pool: ProcessPoolExecutor | None = None
        self.on_progress: Callable[[str, int, int, float | None], None] | None = None
        self.on_scoring: Callable[[str, str, int, int, int], None] | None = None

    def stop(self) -> None:
        self.stopping = True
        _STOP.set()
        pool = self._pool
        for process in list(getattr(pool, "_processes", {}).values()) if pool else []:
            try:
                os.kill(process.pid, signal.SIGTERM)
            except (ProcessLookupError, AttributeError):
                pass

    def map(self, fn, cells):
        if self.jobs == 1:
            for cell in cells:
                if self.stopping:
                    return
                yield cell, fn(cell)
            return
        context = multiprocessing.get_context()
        events = context.Queue()
        drain_stop = threading.Event()
        drainer = threading.Thread(target=self._drain, args=(events, drain_stop), daemon=True)
        drainer.start()
        try:
            yield from self._map_pool(fn, cells, context, events)
        finally:
            drain_stop.set()
            drainer.join(timeout=5)

    def _drain(self, events, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                kind, label, values = events.get(timeout=0.2)  # see _CellRunner
            except queue.Empty:
                continue
            except (EOFError, OSError, ValueError):
                return
            report = self.on_scoring if kind == "scoring" else self.on_progress
            if report is not None:
                report(label, *values)

    def _map_pool(self, fn, cells, context, events):
        with ProcessPoolExecutor(max_workers=self.jobs, mp_context=context, initializer=_worker_init,
                                 initargs=(events,)) as pool:
            self._pool = pool
            pending = list(cells)
            running: dict[Future, Cell] = {}
            while pending or running:
                while pending and len(running) < self.jobs and not self.stopping:
                    cell = pending.pop(0)
                    running[pool.submit(fn, cell)] = cell
                if not running:
                    break
                done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    cell = running.pop(future)
                    try:
                        yield cell, future.result()
                    except Exception as exc:  # a worker process died (e.g. killed): the cell is resumable
                        yield cell, {"status": "interrupted", "skipped": False, "test_score": None,
                                     "error": f"worker process failed: {type(exc).__name__}: {exc}"}
            self._pool = None


# -- configuration -------------------------------------------------------------------------------
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
    # how long one endpoint call may take, and how often a failed one is retried, before the
    # example counts as an infrastructure failure (where the endpoint lives, not the experiment)
    model_timeout: float = 60.0
    model_retries: int = 6

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise HeldoutError(f"unknown visibility policy {self.policy!r}; accepted: {', '.join(POLICIES)}")
        if self.cache_dir is not None:  # a study or protocol file's, checked as the flag's is (cli.main)
            check_folder(self.cache_dir, "the response cache folder (cache_dir)")

    def experiment(self) -> dict[str, Any]:
        """The settings that define the experiment. Where data, caches and the model endpoint live
        does not: the models are named by ``worker_model``/``architect_model`` (and each record
        names them), so a study continues when its endpoint comes back on another address, as the
        demos' in-process server does on every start."""
        return {k: v for k, v in asdict(self).items()
                if k not in ("run_root", "data_dir", "cache_dir", "model_concurrency", "base_url", "model_timeout",
                             "model_retries")}


def shortened(text: str, limit: int = 100) -> str:
    """``text`` cut to ``limit`` characters (``...`` marks a cut), for a message naming settings."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def study_client(model: str | None, config: StudyConfig) -> ModelClient | None:
    """``model``'s client as the study says (endpoint, cache, concurrency, timeout, retries): a cell's, a protocol's."""
    if not model:
        return None
    cache = ResponseCache(config.cache_dir) if config.cache_dir else None
    return ModelClient(model, base_url=config.base_url, cache=cache, concurrency=config.model_concurrency,
                       timeout=config.model_timeout, max_retries=config.model_retries)


def cell_settings(cell: Cell, config: StudyConfig) -> dict[str, Any]:
    """What a finished record of this cell must agree with to count as done."""
    return {"task": cell.task, "profile": cell.profile, "seed": cell.seed, "method": cell.method.name,
            "budget": asdict(Budget(cell.budget, config.architect_tokens, config.wall_seconds, config.architect_calls)),
            "policy": config.policy, "options": dict(cell.options), "decoding": asdict(cell.decoding),
            "worker": config.worker_model, "architect": config.architect_model, "verifier": cell.verifier,
            "optimizer code": cell_method(cell, config).code_sha256, "optimizer options": dict(cell.method.options)}


def cell_method(cell: Cell, config: StudyConfig) -> ResolvedMethod:
    """The one decided value of what ``cell`` runs: the one its study made, else made now, with the
    trust the person granted for this study (``config.trusted_optimizer``)."""
    resolved = cell.resolved
    if resolved is None or resolved.trusted != config.trusted_optimizer:
        resolved = cell.method.resolve(config.trusted_optimizer)
        object.__setattr__(cell, "resolved", resolved)  # decided once per cell, then read
    return resolved


def cell_is_isolated(cell: Cell, config: StudyConfig) -> bool:
    """Commands and user code (``module:function``, an optimizer plugin's name, a reference
    optimizer given the user's code as an option, such as a DSPy program) run isolated unless the
    person running the study trusts them; only heldout's reference optimizers run in-process by default."""
    return cell_method(cell, config).isolated


@contextlib.contextmanager
def _waiting():
    """The main thread only waits here (no ledger write of its own): a stop is raised at once."""
    global _WAITING
    outer, _WAITING = _WAITING, True
    try:
        if _STOP.is_set():
            _checkpoint()
        yield
    finally:
        _WAITING = outer


def finished_summary(run_dir: Path, wanted: dict[str, Any]) -> dict[str, Any]:
    """The summary of the finished run in ``run_dir``, when it was made under the settings
    ``wanted`` (:func:`cell_settings`); :class:`ExperimentMismatch` naming what differs otherwise."""
    record = RunRecord.load(run_dir)
    exp = record.experiment
    optimizer = exp.get("optimizer") or {}
    recorded = {"task": record.task, "profile": record.profile, "seed": record.seed, "method": record.method,
                "budget": record.budget, "policy": record.policy.get("name"), "options": record.task_options,
                "decoding": record.decoding,
                "worker": (exp.get("worker") or {}).get("model"), "architect": (exp.get("architect") or {}).get("model"),
                "verifier": exp.get("verifier"), "optimizer code": optimizer.get("code_sha256"),
                "optimizer options": optimizer.get("options", {})}
    texts = {k: (canonical_json(recorded[k]), canonical_json(wanted[k])) for k in wanted}
    differing = [f"{k}: {shortened(was)} -> {shortened(now)}" for k, (was, now) in texts.items() if was != now]
    if differing:
        raise ExperimentMismatch(f"{run_dir} holds a finished run of another experiment; it differs in "
                                 f"{'; '.join(differing)}. Use a new run dir")
    return {"status": record.status, "skipped": True, "test_score": record.test_score, "error": record.error,
            "run_dir": str(run_dir)}


def run_cell(cell: Cell, config: StudyConfig, progress: Callable[[int, int, float | None], None] | None = None,
             scoring: Callable[[str, int, int, int], None] | None = None) -> dict[str, Any]:
    """Run (or resume, or skip) one cell, top-down: what it runs (decided once), a finished run of
    the same settings kept, its code checked against the code decided, its protected session
    opened (new, or resumed from its ledger), the method run in it (isolated, or in-process for
    heldout's own code) to an :class:`Outcome`, and the session finished with it, once. Never
    raises for a failing optimizer: the record says; a failing infrastructure gives status
    ``incomplete`` (no record; ``--resume`` finishes it). Raises :class:`ExperimentMismatch` when
    the cell's dir holds another experiment."""
    run_dir = cell.run_dir(config.run_root)
    method = cell_method(cell, config)
    settings = cell_settings(cell, config)
    if (run_dir / RECORD_FILE).exists():
        return finished_summary(run_dir, settings)
    changed = method.code_changed()  # the record must name the code that runs, not the code once decided
    global _WAITING, _INTERRUPTED

    def checkpoint(used: int, budget: int, best: float | None) -> None:
        if progress is not None:
            progress(used, budget, best)
        _checkpoint()

    _INTERRUPTED = False
    # the cell made these clients, so the cell closes them: their connections and loop threads end with it
    models = SessionModels(worker=study_client(config.worker_model, config),
                           architect=study_client(config.architect_model, config))
    try:
        # the cell's protected session: new, or resumed from the ledger in its run dir
        session = Session(cell.task, profile=cell.profile,
                          budget=Budget(cell.budget, config.architect_tokens, config.wall_seconds, config.architect_calls),
                          seed=cell.seed, run_dir=run_dir,
                          models=models,
                          policy=config.policy, data_dir=config.data_dir, allow_drift=config.allow_drift,
                          method=cell.method.name, decoding=cell.decoding, options=cell.options, verifier=cell.verifier,
                          provenance={"optimizer": method.describe(), "isolation": method.isolation})
        session.service.progress = checkpoint
        session.service.interruptible = _waiting
        session.heldout_progress = scoring
        try:
            if changed:
                outcome = Outcome(error=changed)
            elif method.isolated:
                # commands and user code: isolated by default (the trust model); heldout's reference names run in-process
                launch = method_launch(method)
                outcome = launch_isolated(session, launch)
            else:
                session.service.record_event("optimizer_trust", {"optimizer": method.spec, "trusted": True,
                                                                 "isolation": "trusted, not isolated"})
                outcome = session.optimise(resolve_optimizer(method.spec, method.method_options))
            record = session.finish(outcome)
        except StudyInterrupted:
            session.ledger.close()
            return {"status": "interrupted", "skipped": False, "test_score": None,
                    "error": "interrupted; its ledger is consistent and the cell resumes from it",
                    "run_dir": str(run_dir)}
        except InfrastructureFailure as exc:
            session.ledger.close()
            return {"status": "incomplete", "skipped": False, "test_score": None, "error": str(exc),
                    "run_dir": str(run_dir)}
        finally:
            _WAITING = False
    finally:
        for client in (models.worker, models.architect):
            if client is not None:
                client.close()
    return {"status": record.status, "skipped": False, "test_score": record.test_score,
            "error": record.error, "run_dir": str(run_dir)}


class _CellRunner:
    """Picklable ``cell -> summary`` for process pools; sends progress to the parent's queue."""

    def __init__(self, config: StudyConfig, progress: Progress | None = None) -> None:
        self.config = config
        self.local_progress = progress  # only used in-process (jobs=1); not pickled

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "local_progress": None}

    def __call__(self, cell: Cell) -> dict[str, Any]:
        events = _WORKER_EVENTS
        if self.local_progress is not None:
            report = self.local_progress

            def hook(used, budget, best):
                report.update(cell.label, used, budget, best)

            def scoring(split, done, total, errors):
                report.scoring(cell.label, split, done, total, errors)
        elif events is not None:
            def hook(used, budget, best):
                events.put(("progress", cell.label, (used, budget, best)))

            def scoring(split, done, total, errors):
                events.put(("scoring", cell.label, (split, done, total, errors)))
        else:
            hook = scoring = None
        try:
            return run_cell(cell, self.config, hook, scoring)
        except ExperimentMismatch as exc:  # the cell's dir holds another experiment: say so, run the rest
            return {"status": "refused", "skipped": False, "test_score": None, "error": str(exc),
                    "run_dir": str(cell.run_dir(self.config.run_root))}


def run_study(cells: list[Cell], config: StudyConfig, executor: Executor | None = None,
              progress: bool = True, resume_hint: str | None = None) -> list[dict[str, Any]]:
    """Run every cell; returns one summary per cell (``status`` ok / failed / incomplete / refused /
    interrupted / not started). On SIGINT/SIGTERM no further cell starts, running cells stop
    resumably, and a summary says what finished and how to resume."""
    executor = executor or LocalExecutor(1)
    report = Progress(len(cells), enabled=progress)
    in_process = isinstance(executor, LocalExecutor) and executor.jobs == 1
    results: list[dict[str, Any]] = []
    caught: list[str] = []
    lost: str | None = None  # what the probe said once a cell lost the study's endpoint

    def on_signal(signum, frame):
        caught.append(signal.Signals(signum).name)
        if len(caught) == 1:
            getattr(executor, "stop", lambda: None)()
            if in_process:
                _request_stop(signum)  # an isolated cell running in this process stops at once

    _STOP.clear()
    installed = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            installed[sig] = signal.signal(sig, on_signal)
    if hasattr(executor, "on_progress"):
        executor.on_progress = report.update
    if hasattr(executor, "on_scoring"):
        executor.on_scoring = report.scoring
    try:
        runner = _CellRunner(config, report if in_process else None)
        for cell, summary in executor.map(runner, cells):
            results.append({"task": cell.task, "method": cell.method.name, "seed": cell.seed, **summary})
            report.finished(cell.label, summary)
            if summary["status"] == "incomplete" and lost is None and (lost := endpoint_lost(config)):
                # no further cell: each would retry the dead endpoint for minutes to the same end
                executor.stopping = True  # (a local pool's running cells end as they will)
    except StudyInterrupted:
        pass  # in-process: raised by the signal handler; the summary below says what happened
    finally:
        for sig, handler in installed.items():
            signal.signal(sig, handler)
    if caught:
        finished = {(r["task"], r["method"], r["seed"]) for r in results}
        for cell in cells:
            if (cell.task, cell.method.name, cell.seed) not in finished:
                run_dir = cell.run_dir(config.run_root)
                started = (run_dir / "ledger.jsonl").exists() and not (run_dir / RECORD_FILE).exists()
                results.append({"task": cell.task, "method": cell.method.name, "seed": cell.seed,
                                "status": "interrupted" if started else "not started",
                                "skipped": False, "test_score": None, "error": None,
                                "run_dir": str(cell.run_dir(config.run_root))})
        print(interrupt_summary(results, caught[0], config.run_root, resume_hint), file=sys.stderr, flush=True)
    elif lost is not None:  # resumable: no record, and no cell's score
        done = {(r["task"], r["method"], r["seed"]) for r in results}
        results += [{"task": c.task, "method": c.method.name, "seed": c.seed, "status": "incomplete", "skipped": False,
                     "test_score": None, "error": f"not started: {lost}", "run_dir": str(c.run_dir(config.run_root))}
                    for c in cells if (c.task, c.method.name, c.seed) not in done]
    if not caught and progress and any(r["status"] == "incomplete" for r in results):
        print(incomplete_summary(results, config.run_root, resume_hint), file=sys.stderr, flush=True)
    return results


def endpoint_lost(config: StudyConfig) -> str | None:
    """After a cell ended incomplete: what one probe of the study's model endpoint says, or None
    when it answers (the cell lost something else, or the endpoint is back)."""
    try:
        check_endpoints(config.worker_model, config.architect_model, config.base_url,
                        then="no further cell was started")
    except InfrastructureFailure as exc:
        return str(exc)
    return None


def incomplete_summary(results: list[dict[str, Any]], run_root: str, resume_hint: str | None) -> str:
    """What a study whose infrastructure failed tells its user: which cells have no score, and how
    to finish them once the endpoint, sandbox or disk is back."""
    lost = [r for r in results if r["status"] == "incomplete"]
    lines = [f"heldout: {len(lost)} of {len(results)} cell(s) INCOMPLETE: the infrastructure failed, not the "
             "candidate; they have no score (not 0) until resumed."]
    lines += [f"  incomplete: {r['task']} {r['method']} seed {r['seed']}: {r.get('error')}" for r in lost]
    lines.append(f"  resume with: {resume_hint or 'the same command plus --resume'}  (run dir {run_root}); only "
                 "what is missing runs again")
    return "\n".join(lines)


def interrupt_summary(results: list[dict[str, Any]], signame: str, run_root: str, resume_hint: str | None) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    done = counts.get("ok", 0) + counts.get("failed", 0)
    lines = [f"heldout: study interrupted by {signame}: {done} of {len(results)} cell(s) finished "
             f"({counts.get('ok', 0)} ok, {counts.get('failed', 0)} failed), {counts.get('interrupted', 0)} "
             f"interrupted (ledgers consistent), {counts.get('incomplete', 0)} incomplete (infrastructure "
             f"failed), {counts.get('not started', 0)} not started."]
    lines += [f"  {r['status']}: {r['task']} {r['method']} seed {r['seed']}" for r in results
              if r["status"] in ("interrupted", "incomplete")]
    lines.append(f"  resume with: {resume_hint or 'the same command plus --resume'}  (run dir {run_root})")
    return "\n".join(lines)


def build_cells(tasks: list[str], methods: list[Method], seeds: list[int], budgets: dict[str, int],
                profile: str, options: dict[str, Any], verifiers: list[str] | None = None,
                decided: dict[str, ResolvedMethod] | None = None) -> list[Cell]:
    """Every cell; ``options`` as a study states them (task options, decoding settings among them:
    split here, once); ``decided`` (method name -> what it runs, decided once by the study) is
    shared by that method's cells."""
    decided = decided or {}
    decoding, task_options = Decoding.split(options)
    return [Cell(task, method, seed, budgets[task], profile, task_options, verifier, decided.get(method.name), decoding)
            for task in tasks for method in methods for verifier in (verifiers or ["decomposed"])
            for seed in seeds]
