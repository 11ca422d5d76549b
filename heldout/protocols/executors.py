"""Distributed executors behind the runner's one-method :class:`~heldout.protocols.run.Executor`
interface (``map(fn, cells)`` yielding ``(cell, summary)`` as each cell finishes).

:class:`RayExecutor` runs each cell as one Ray task with its own CPU/memory request, on a local
Ray instance or an existing cluster (``--executor ray --ray-address ADDR``). The rules:

* **Same run dirs.** The task calls the very function the local executor calls, so a cell writes
  the same ``<task>/<method>/seed-<n>/`` layout, ledger and run record; the run root must be on a
  file system every Ray node shares.
* **One writer per cell.** The task holds an exclusive ``flock`` on ``RUN_ROOT/.locks/<cell>.lock``
  for as long as it runs the cell. The kernel drops the lock when the holder dies, so a retry
  after a preemption waits for a stale attempt to be gone, never writes beside it. The lock files
  live outside the cell dirs: those stay byte-for-byte the local executor's.
* **Retried from the ledger.** A cell whose worker died (crash, preemption, lost node) or that
  came back ``interrupted`` (its session stopped at a consistent ledger point) is resubmitted up
  to ``retries`` times; the new attempt resumes the session from its ledger (spent budget stays
  spent, recorded evaluations replay), exactly as a re-run of ``heldout run`` would.
* **Same isolation.** Sandboxed candidates are started by the Ray worker with the same sandbox;
  the driver's ``$HELDOUT_DATA_DIR``, ``$HELDOUT_SANDBOX_HIDE``, ``$HELDOUT_SANDBOX_ISOLATION`` and
  ``$HELDOUT_UNSAFE_NO_SANDBOX`` are forwarded to the workers (when Ray is started here), so the
  same paths are hidden and the same isolation is required.

Ray is an optional extra (``pip install heldout[ray]``); importing this module does not need it."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from heldout.contracts import HeldoutError
from heldout.protocols.run import Cell, LocalExecutor
from heldout.sandbox.process import HIDE_ENV, ISOLATION_ENV, UNSAFE_ENV

LOCK_DIR = ".locks"
# Driver environment a worker needs for the same sandbox (hidden paths, isolation choice, the
# explicit unsafe opt-in) and the same data.
FORWARDED_ENV = ("HELDOUT_DATA_DIR", HIDE_ENV, ISOLATION_ENV, UNSAFE_ENV)


class ExecutorError(HeldoutError):
    """The executor cannot run (engine missing, cluster unreachable, bad resource request)."""


@dataclass(frozen=True)
class CellResources:
    """What one cell asks the scheduler for: CPUs (a cell is one session, mostly one busy core)
    and memory in MB (None: no memory request)."""

    cpus: float = 1.0
    memory_mb: int | None = None

    def __post_init__(self) -> None:
        if not self.cpus > 0:
            raise ExecutorError(f"a cell needs a positive CPU request, got {self.cpus!r}")
        if self.memory_mb is not None and self.memory_mb < 1:
            raise ExecutorError(f"a cell's memory request must be >= 1 MB, got {self.memory_mb!r}")

    def ray_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.cpus}
        if self.memory_mb is not None:
            options["memory"] = self.memory_mb * 2**20
        return options


def lock_path(cell: Cell, run_root: str | Path) -> Path:
    """Where the writer lock of ``cell`` lives: one file per cell dir, outside the cell dirs."""
    relative = cell.run_dir(run_root).relative_to(Path(run_root))
    return Path(run_root) / LOCK_DIR / ("__".join(relative.parts) + ".lock")


@contextmanager
def cell_lock(path: Path, poll_seconds: float = 0.2) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (waiting while another attempt holds it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(poll_seconds)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.uname().nodename} pid {os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # closing releases the lock


def run_locked_cell(fn: Callable[[Cell], dict[str, Any]], cell: Cell, run_root: str) -> dict[str, Any]:
    """The body of one Ray task: run ``fn(cell)`` while holding the cell's writer lock."""
    with cell_lock(lock_path(cell, run_root)):
        summary = fn(cell)
    return {**summary, "node": os.uname().nodename}


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ExecutorError("--executor ray needs Ray: pip install 'heldout[ray]'") from None
    return ray


class RayExecutor:
    """Each cell is one Ray task (``resources`` per cell); results are yielded as cells finish.

    ``address`` is a Ray cluster address (``ray://host:10001``, ``host:6379`` or ``auto``); None
    starts a local Ray instance unless Ray is already initialised in this process (as tests do),
    in which case that instance is used. ``retries`` bounds the resubmissions of one cell."""

    def __init__(self, run_root: str | Path, address: str | None = None, *,
                 resources: CellResources | None = None, retries: int = 2,
                 log: Callable[[str], None] | None = None) -> None:
        if retries < 0:
            raise ExecutorError(f"retries must be >= 0, got {retries!r}")
        self.run_root = str(run_root)
        self.address = address
        self.resources = resources or CellResources()
        self.retries = retries
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.jobs: int | None = None  # cells in flight: the cluster's CPUs / the CPU request, once connected
        self.stopping = False
        self.on_progress: Callable[..., None] | None = None  # cell-level progress comes from run_study
        self._running: dict[Any, tuple[Cell, int]] = {}
        self._ray: Any = None
        self._started_ray = False

    # -- lifecycle --------------------------------------------------------------------------------
    def connect(self):
        """Connect to (or start) Ray; returns the ``ray`` module."""
        ray = self._ray or _import_ray()
        if not ray.is_initialized():
            env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
            try:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": env} if env else None)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ExecutorError(f"cannot reach the Ray cluster at {self.address or 'a new local instance'}: "
                                    f"{exc}") from None
            self._started_ray = True
        self._ray = ray
        cpus = ray.cluster_resources().get("CPU", 1)
        if self.resources.cpus > cpus:
            raise ExecutorError(f"a cell asks for {self.resources.cpus:g} CPUs, the Ray cluster has {cpus:g}")
        self.jobs = max(2, int(cpus // self.resources.cpus))  # >1: run_study must not treat this as in-process
        return ray

    def close(self) -> None:
        """Shut down the Ray instance this executor started (a connected cluster keeps running)."""
        if self._started_ray and self._ray is not None:
            self._ray.shutdown()
            self._started_ray = False

    def stop(self) -> None:
        """Start no further cell; interrupt the running ones (each stops with a resumable ledger)."""
        self.stopping = True
        if self._ray is not None:
            for ref in list(self._running):
                self._ray.cancel(ref, force=False)

    # -- the Executor interface -------------------------------------------------------------------
    def map(self, fn: Callable[[Cell], dict[str, Any]], cells: list[Cell]) -> Iterator[tuple[Cell, dict[str, Any]]]:
        ray = self.connect()
        # max_retries=0: a lost worker is resubmitted here, bounded, logged, from the cell's ledger
        remote = ray.remote(max_retries=0, **self.resources.ray_options())(run_locked_cell)
        fn_ref = ray.put(fn)  # one copy of the runner (and its config) in the object store

        def submit(cell: Cell, attempt: int) -> None:
            ref = remote.options(name=f"heldout cell {_label(cell)}").remote(fn_ref, cell, self.run_root)
            self._running[ref] = (cell, attempt)

        for cell in cells:
            submit(cell, 0)
        try:
            while self._running:
                done, _ = ray.wait(list(self._running), num_returns=1, timeout=1.0)
                for ref in done:
                    cell, attempt = self._running.pop(ref)
                    summary, retryable = self._outcome(ray, ref)
                    if retryable and not self.stopping and attempt < self.retries:
                        self.log(f"  {_label(cell)}: {summary.get('error') or 'interrupted'}; "
                                 f"retrying from its ledger (attempt {attempt + 2} of {self.retries + 1})")
                        submit(cell, attempt + 1)
                        continue
                    yield cell, {**summary, "attempts": attempt + 1}
        finally:
            for ref in list(self._running):  # the consumer stopped early: leave nothing running
                ray.cancel(ref, force=False)
            self._running.clear()

    def _outcome(self, ray, ref) -> tuple[dict[str, Any], bool]:
        """``(summary, retryable)``. A lost worker or an ``interrupted`` session is retryable; a
        runner that raised is not (the same cell would raise again), its ledger stays resumable."""
        retryable = False
        try:
            summary = ray.get(ref)
            return summary, summary.get("status") == "interrupted"
        except ray.exceptions.TaskCancelledError:
            reason = "cancelled (study stopped); its ledger is consistent and the cell resumes from it"
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError, ray.exceptions.OutOfMemoryError) as exc:
            reason, retryable = f"Ray worker lost ({type(exc).__name__})", True
        except ray.exceptions.RayTaskError as exc:
            reason = f"cell raised {type(exc.cause).__name__}: {exc.cause}"
        return {"status": "interrupted", "skipped": False, "test_score": None, "error": reason}, retryable


def _label(cell: Cell) -> str:
    return getattr(cell, "label", None) or f"{cell.task} {cell.method.name} seed {cell.seed}"


EXECUTORS = ("local", "ray")


def make_executor(name: str, run_root: str | Path, *, jobs: int = 1, ray_address: str | None = None,
                  cell_cpus: float = 1.0, cell_memory_mb: int | None = None):
    """The executor ``heldout run --executor NAME`` asks for (``local``: the process pool)."""
    if name == "local":
        if ray_address:
            raise ExecutorError("--ray-address needs --executor ray")
        return LocalExecutor(jobs)
    if name == "ray":
        return RayExecutor(run_root, ray_address, resources=CellResources(cell_cpus, cell_memory_mb))
    raise ExecutorError(f"unknown executor {name!r}; accepted: {', '.join(EXECUTORS)}")
