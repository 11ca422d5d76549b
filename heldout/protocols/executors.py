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
  ``$HELDOUT_UNSAFE_NO_SANDBOX`` are forwarded to the workers (when this executor connects), so
  the same paths are hidden and the same isolation is required.
* **Checked nodes.** Before the first cell, one task on every alive node with CPUs reports the
  containment a cell would get there (:func:`node_containment`: sandbox isolation level, the data
  dir, the ledger key); a node weaker than the driver in any of them stops the study with one
  line naming the node and what is weaker (:func:`weaker_containment`), before any cell runs.
  Each cell checks its own node again before it starts (a node that joined later, an autoscaled
  worker, is checked too): on a weaker node the cell is ``refused``, nothing of it run or written.
* **The user's code travels.** The files (or top-level package dirs) of the user's optimizer
  and of the code its options name are found on the driver's path without importing them and
  shipped with each cell's Ray runtime environment (``py_modules``), so a node that lacks them
  imports the same code; heldout itself must be installed on every node.
* **Node-local response cache.** The cache is SQLite in WAL mode, whose shared-memory index does
  not work on a network file system; a Ray cell keeps the study's cache under
  ``$HELDOUT_NODE_CACHE_DIR`` (else the node's temp dir), never under the run root
  (:func:`node_cache_dir`). Nodes therefore do not share cached answers.

Ray is an optional extra (``pip install heldout[ray]``); importing this module does not need it."""

from __future__ import annotations

import copy
import dataclasses
import fcntl
import hashlib
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from heldout.contracts import HeldoutError
from heldout.benchmarks.loading import DATA_DIR_ENV
from heldout.benchmarks.registry import get_benchmark
from heldout.evaluators.ledger import LedgerError, ledger_key, ledger_key_path
from heldout.protocols.run import Cell, LocalExecutor
from heldout.sandbox.process import HIDE_ENV, ISOLATION_ENV, UNSAFE_ENV, isolation_level

LOCK_DIR = ".locks"
# Driver environment a worker needs for the same sandbox (hidden paths, isolation choice, the
# explicit unsafe opt-in) and the same data.
FORWARDED_ENV = (DATA_DIR_ENV, HIDE_ENV, ISOLATION_ENV, UNSAFE_ENV)
NODE_CACHE_ENV = "HELDOUT_NODE_CACHE_DIR"
# Cores one cell keeps busy (issue 36, measured on 2 cores): a CPU-bound program cell 1.39
# (harness + sandboxed child + fork server); a prompt cell waits on its model endpoint.
PROGRAM_CELL_CPUS = 1.4
PROMPT_CELL_CPUS = 0.25
# Sandbox isolation levels, weakest first; the two cgroup versions enforce the same limits.
ISOLATION_RANK = {"none": 0, "bwrap+rlimit": 1, "bwrap+cgroup-v1": 2, "bwrap+cgroup-v2": 2}
NODE_CHECK_SECONDS = 120.0


class ExecutorError(HeldoutError):
    """The executor cannot run (engine missing, cluster unreachable, bad resource request)."""


@dataclass(frozen=True)
class CellResources:
    """What one cell asks the scheduler for: CPUs and memory in MB (None: no memory request).

    ``cpus=None`` (the default) asks for what the cell uses: :data:`PROGRAM_CELL_CPUS` (1.4) for a
    program task, whose CPU-bound cell keeps 1.39 cores busy (the harness, the sandboxed child and
    its fork server), and :data:`PROMPT_CELL_CPUS` (0.25) for a prompt task, whose cell mostly
    waits on the model endpoint. A default larger than the largest node is lowered to that node's
    CPUs (a default must not make a study unschedulable); an explicit request is kept as given."""

    cpus: float | None = None
    memory_mb: int | None = None

    def __post_init__(self) -> None:
        if self.cpus is not None and not self.cpus > 0:
            raise ExecutorError(f"a cell needs a positive CPU request, got {self.cpus!r}")
        if self.memory_mb is not None and self.memory_mb < 1:
            raise ExecutorError(f"a cell's memory request must be >= 1 MB, got {self.memory_mb!r}")

    def cpus_for(self, kind: str, largest_node: float | None = None) -> float:
        """The CPU request of a cell of task ``kind`` (``program`` or ``prompt``)."""
        if self.cpus is not None:
            return self.cpus
        wanted = PROGRAM_CELL_CPUS if kind == "program" else PROMPT_CELL_CPUS
        return min(wanted, largest_node) if largest_node else wanted

    def ray_options(self, kind: str = "program", largest_node: float | None = None) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.cpus_for(kind, largest_node)}
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


def run_locked_cell(fn: Callable[[Cell], dict[str, Any]], cell: Cell, run_root: str,
                    driver: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body of one Ray task: run ``fn(cell)`` while holding the cell's writer lock, with the
    study's response cache kept on this node (:func:`node_cache_dir`). With ``driver`` (the
    driver's :func:`node_containment`), a node weaker than the driver refuses the cell before
    anything of it runs or is written: the start-up check sees the nodes alive when the study
    starts, this one also a node that joined later (an autoscaled worker)."""
    if driver is not None:
        config = getattr(fn, "config", None)
        weaker = weaker_containment(driver, node_containment(getattr(config, "data_dir", None)))
        if weaker:
            return {"status": "refused", "skipped": False, "test_score": None, "node": os.uname().nodename,
                    "run_dir": str(cell.run_dir(run_root)),
                    "error": f"node {os.uname().nodename} is weaker than the driver: {'; '.join(weaker)}"}
    fn = with_node_local_cache(fn, run_root)
    with cell_lock(lock_path(cell, run_root)):
        summary = fn(cell)
    return {**summary, "node": os.uname().nodename}


def node_cache_dir(cache_dir: str, run_root: str | Path) -> Path:
    """Where a Ray cell on this node keeps the response cache the study names as ``cache_dir``:
    ``$HELDOUT_NODE_CACHE_DIR`` (else the node's temp dir) / ``heldout-response-cache`` / a folder
    per study cache (its path hashed). Never under the run root, which is on the shared file
    system, where SQLite's WAL cannot be used safely."""
    base = Path(os.environ.get(NODE_CACHE_ENV) or tempfile.gettempdir()) / "heldout-response-cache"
    local = (base / hashlib.sha256(cache_dir.encode()).hexdigest()[:16]).resolve()
    root = Path(run_root).resolve()
    if local == root or root in local.parents:
        raise ExecutorError(f"the node-local response cache {local} is under the run root {root} "
                            f"(a shared file system); point ${NODE_CACHE_ENV} at a local disk")
    return local


def with_node_local_cache(fn: Callable[[Cell], dict[str, Any]], run_root: str) -> Callable[[Cell], dict[str, Any]]:
    """``fn`` (run_study's cell runner, whose ``config`` is the study's) with its response cache
    moved to :func:`node_cache_dir`; unchanged when the study keeps no cache."""
    config = getattr(fn, "config", None)
    if config is None or not getattr(config, "cache_dir", None):
        return fn
    local = copy.copy(fn)
    local.config = dataclasses.replace(config, cache_dir=str(node_cache_dir(config.cache_dir, run_root)))
    return local


def shipped_modules(cells: list[Cell]) -> list[str]:
    """The files (plain modules) or top-level package dirs of the user code the cells name (an
    optimizer's ``module:function``, a plugin's target, code options such as a DSPy program),
    found on the driver's path without importing them; heldout's own modules are not included."""
    found: dict[str, None] = {}
    first = {cell.method.name: cell for cell in cells}.values()
    for cell in first:
        if cell.method.command:
            continue  # a command's files are named by path: they must be on the shared file system
        for module in (cell.resolved or cell.method.resolve()).modules:  # decided by the study, else now
            found[str(module.top)] = None
    return list(found)


def node_containment(data_dir: str | None) -> dict[str, Any]:
    """What containment a cell would get on this machine: the sandbox's isolation level (or why
    none can be built), the data dir it would read (``data_dir``, else ``$HELDOUT_DATA_DIR``) and
    whether it exists, and the ledger key its ledgers' heads are anchored under (a fingerprint,
    never the key)."""
    try:
        isolation = isolation_level()
    except HeldoutError as exc:
        isolation = f"unusable ({exc})"
    chosen = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV) or None
    try:
        key = ledger_key(create=False)
        key_id = hashlib.sha256(key).hexdigest()[:16] if key is not None else None
    except LedgerError:
        key_id = "unreadable"
    return {"host": os.uname().nodename, "isolation": isolation, "data_dir": chosen,
            "data_dir_found": chosen is None or Path(chosen).is_dir(),
            "ledger_key": str(ledger_key_path()), "ledger_key_id": key_id}


def weaker_containment(driver: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """What of ``node``'s containment (:func:`node_containment`) is weaker than ``driver``'s; empty
    when none is. Weaker: a lower isolation level, a named data dir that is not there, and, when
    the driver has a ledger key, a missing or different one (the heads a cell anchors there would
    not verify on the driver)."""
    weaker = []
    if ISOLATION_RANK.get(node["isolation"], -1) < ISOLATION_RANK.get(driver["isolation"], -1):
        weaker.append(f"sandbox isolation {node['isolation']} (driver: {driver['isolation']})")
    if not node["data_dir_found"]:
        weaker.append(f"data dir {node['data_dir']} does not exist there")
    if driver["ledger_key_id"] not in (None, "unreadable") and node["ledger_key_id"] != driver["ledger_key_id"]:
        state = "no ledger key" if node["ledger_key_id"] is None else "a ledger key that is not the driver's"
        weaker.append(f"{state} at {node['ledger_key']} (heads anchored there would not verify on the driver)")
    return weaker


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
        self._largest_node: float | None = None
        self.checked_nodes: dict[str, dict[str, Any]] = {}  # node id -> its start-up report

    # -- lifecycle --------------------------------------------------------------------------------
    def connect(self, py_modules: list[str] | None = None):
        """Connect to (or start) Ray, shipping ``py_modules`` (files or package dirs) to every
        worker of this job; returns the ``ray`` module. Ray ships local code only for a job it
        starts here, so when Ray is already initialised in this process nothing is shipped (and a
        line says so): the nodes must then have that code on their path."""
        ray = self._ray or _import_ray()
        if ray.is_initialized():
            if py_modules and not self._started_ray:
                self.log(f"heldout: Ray was initialised before this study: {', '.join(py_modules)} not shipped; "
                         "every node must have it on its path")
        else:
            env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
            runtime_env = {**({"env_vars": env} if env else {}), **({"py_modules": py_modules} if py_modules else {})}
            # no address and no $RAY_ADDRESS: a new local instance, as documented ("local"; Ray's
            # own default would join whichever cluster this machine started last)
            address = self.address or os.environ.get("RAY_ADDRESS") or "local"
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         runtime_env=runtime_env or None)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = "a new local instance" if address == "local" else address
                raise ExecutorError(f"cannot reach the Ray cluster at {where}: {exc}") from None
            self._started_ray = True
        self._ray = ray
        cpus = ray.cluster_resources().get("CPU", 1)
        self._largest_node = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]), default=cpus)
        if self.resources.cpus is not None and self.resources.cpus > self._largest_node:
            raise ExecutorError(f"a cell asks for {self.resources.cpus:g} CPUs, the largest Ray node has "
                                f"{self._largest_node:g}")
        # >1: run_study must not treat this as in-process
        self.jobs = max(2, int(cpus // self.resources.cpus_for("prompt", self._largest_node)))
        return ray

    def check_nodes(self, data_dir: str | None, driver: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Run :func:`node_containment` once on every alive node with CPUs (pinned there) and
        raise :class:`ExecutorError`, one line naming each weaker node and what is weaker, when
        any is weaker than this driver's ``driver`` report (:func:`weaker_containment`). Nodes
        checked before are not asked again. Returns the reports by node id."""
        ray = self._ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = ray.remote(num_cpus=0, max_retries=0)(node_containment)
        nodes = {n["NodeID"]: n for n in ray.nodes()
                 if n["Alive"] and n["Resources"].get("CPU", 0) > 0 and n["NodeID"] not in self.checked_nodes}
        refs = {node_id: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                                       name="heldout node check").remote(data_dir) for node_id in nodes}
        try:
            reports = dict(zip(refs, ray.get(list(refs.values()), timeout=NODE_CHECK_SECONDS)))
        except ray.exceptions.GetTimeoutError:
            raise ExecutorError(f"the Ray nodes did not all answer the start-up check within "
                                f"{NODE_CHECK_SECONDS:g} s") from None
        problems = [f"node {nodes[i]['NodeManagerAddress']} ({i[:12]}): {'; '.join(weaker)}"
                    for i, report in reports.items() if (weaker := weaker_containment(driver, report))]
        if problems:
            raise ExecutorError("refusing to run cells where containment is weaker than on this driver: "
                                + " | ".join(problems))
        self.checked_nodes.update(reports)
        return reports

    def prepare(self, cells: list[Cell], data_dir: str | None) -> None:
        """Connect and check every node now (what :meth:`map` does first), so a study whose
        cluster is unreachable or refused is refused before any file of it is written."""
        self.connect(shipped_modules(cells))
        self.check_nodes(data_dir, node_containment(data_dir))

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
        ray = self.connect(shipped_modules(cells))
        data_dir = getattr(getattr(fn, "config", None), "data_dir", None)
        driver = node_containment(data_dir)  # every node is checked against it, and each cell's node again
        self.check_nodes(data_dir, driver)
        kinds = {task: get_benchmark(task).kind for task in {cell.task for cell in cells}}
        # max_retries=0: a lost worker is resubmitted here, bounded, logged, from the cell's ledger
        remote = ray.remote(max_retries=0)(run_locked_cell)
        fn_ref = ray.put(fn)  # one copy of the runner (and its config) in the object store

        def submit(cell: Cell, attempt: int) -> None:
            options = self.resources.ray_options(kinds[cell.task], self._largest_node)
            ref = remote.options(name=f"heldout cell {_label(cell)}", **options).remote(fn_ref, cell, self.run_root,
                                                                                         driver)
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
                  cell_cpus: float | None = None, cell_memory_mb: int | None = None):
    """The executor ``heldout run --executor NAME`` asks for (``local``: the process pool)."""
    if name == "local":
        if ray_address:
            raise ExecutorError("--ray-address needs --executor ray")
        return LocalExecutor(jobs)
    if name == "ray":
        return RayExecutor(run_root, ray_address, resources=CellResources(cell_cpus, cell_memory_mb))
    raise ExecutorError(f"unknown executor {name!r}; accepted: {', '.join(EXECUTORS)}")
