"""The Ray executor on a cluster of separate nodes on this machine (``ray.cluster_utils.Cluster``:
a head with no CPUs and two one-CPU worker nodes, each its own raylet and workers): a grid whose
node is removed mid-cell finishes with the local executor's records; the user's optimizer module,
on the driver's path only, is shipped to the nodes; the start-up check refuses a node whose
containment is weaker than the driver's, before any cell runs; a Ray cell's response cache is
kept on its node, never under the run root."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the [ray] extra is not installed (pip install 'heldout[ray]')")

from ray.cluster_utils import Cluster

from heldout.benchmarks.loading import DATA_DIR_ENV
from heldout.evaluators.ledger import KEY_ENV, LEDGER_FILE, ledger_key, read_entries, verify_ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.models.cache import ResponseCache
from heldout.models.testserver import TestServer
from heldout.protocols.executors import (NODE_CACHE_ENV, ExecutorError, RayExecutor, node_containment,
                                         run_locked_cell)
from heldout.protocols.run import Cell, LocalExecutor, Method, StudyConfig, build_cells, run_study
from heldout.protocols.study import parse_methods
from heldout.sandbox.process import ISOLATION_ENV, isolation_level
from ray_cell_optimizers import HOLD_MARKERS, HOLD_SECONDS
from test_ray_executor import REPO_ROOT, cell_files, diverging_failures, without_timings

NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
HELD = Cell("lockpicking/six", Method("holds", target="ray_cell_optimizers:holds_on_its_node"), seed=3, budget=120)
DRIVER_ONLY_MODULE = "heldout_test_driver_only_optimizer"
DRIVER_ONLY_SOURCE = '''"""An optimizer whose module exists on the driver's path only."""


def optimize(view, seed):
    view.evaluate(view.seed_candidate, "train", [ex["id"] for ex in view.train][:4])
    return dict(view.seed_candidate)
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head (0 CPUs) + two one-CPU worker nodes. What the nodes' workers read is in the
    environment before they start; the driver connects through each test's RayExecutor."""
    saved = {k: os.environ.get(k) for k in (HOLD_MARKERS, NODE_CACHE_ENV)}
    os.environ[HOLD_MARKERS] = str(tmp_path_factory.mktemp("hold-markers"))
    os.environ[NODE_CACHE_ENV] = str(tmp_path_factory.mktemp("node-local"))
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                          "object_store_memory": 80 * 2**20})
    for _ in range(2):
        nodes.add_node(**NODE)
    nodes.wait_for_nodes()
    yield nodes
    nodes.shutdown()
    for key, value in saved.items():
        os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


def remove_the_node_holding(cluster: Cluster, marker: Path, removed: list[str]) -> None:
    """Wait for the held cell's marker, then remove the worker node it names (its raylet and every
    worker on it die, as when a machine is lost)."""
    deadline = time.monotonic() + HOLD_SECONDS
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if marker.exists():
        node_id = marker.read_text()
        cluster.remove_node(next(n for n in cluster.worker_nodes if n.node_id == node_id))
        removed.append(node_id)


def test_a_grid_whose_node_is_removed_mid_cell_finishes_with_the_local_executors_records(cluster, tmp_path):
    cells = [HELD, *build_cells(["lockpicking/six"], parse_methods(["seed", "local-search"], []), [0, 1],
                                {"lockpicking/six": 60}, "default", {})]
    removed: list[str] = []
    watcher = threading.Thread(target=remove_the_node_holding, daemon=True,
                               args=(cluster, Path(os.environ[HOLD_MARKERS]) / f"seed-{HELD.seed}", removed))
    watcher.start()
    lines: list[str] = []
    # trusted: the held optimizer runs in the Ray worker, so removing its node takes the cell down
    executor = RayExecutor(tmp_path / "ray", address=cluster.address, log=lines.append)
    try:
        distributed = run_study(cells, StudyConfig(run_root=str(tmp_path / "ray"), trusted_optimizer=True),
                                executor, progress=False)
    finally:
        executor.close()
        watcher.join(timeout=5)
        cluster.add_node(**NODE)  # the next tests get two worker nodes again
        cluster.wait_for_nodes()
    assert removed, "the held cell's node was removed"
    assert len(executor.checked_nodes) == 2  # both worker nodes passed the start-up check
    assert [r["status"] for r in distributed] == ["ok"] * len(cells)
    assert {(r["method"], r["seed"]): r["attempts"] for r in distributed} == {
        ("holds", 3): 2, ("seed", 0): 1, ("seed", 1): 1, ("local-search", 0): 1, ("local-search", 1): 1}
    assert any("Ray worker lost" in line and "retrying from its ledger" in line for line in lines)

    local = run_study(cells, StudyConfig(run_root=str(tmp_path / "local"), trusted_optimizer=True), LocalExecutor(1),
                      progress=False)
    scores = [sorted((r["method"], r["seed"], r["test_score"]) for r in rs) for rs in (distributed, local)]
    diverged = diverging_failures(tmp_path / "ray", tmp_path / "local")
    if diverged and (scores[0] != scores[1] or any(
            trimmed_record(c.run_dir(tmp_path / "ray"), c is HELD) != trimmed_record(c.run_dir(tmp_path / "local"))
            for c in cells)):
        pytest.xfail(f"{len(diverged)} evaluations failed in one run only on this loaded machine "
                     f"(e.g. {diverged[0]}), so the two runs legitimately diverged")
    assert scores[0] == scores[1], f"failed in one run only: {diverged}"
    assert cell_files(tmp_path / "ray") == cell_files(tmp_path / "local")
    for cell in cells:
        ray_dir, local_dir = cell.run_dir(tmp_path / "ray"), cell.run_dir(tmp_path / "local")
        assert verify_ledger(ray_dir).ok
        ray_record = without_timings(json.loads((ray_dir / RECORD_FILE).read_text()))
        local_record = without_timings(json.loads((local_dir / RECORD_FILE).read_text()))
        if cell is HELD:  # resumed from its ledger: the evaluation before the loss replayed, not re-run,
            # and the ledger holds the resume itself (a session_resumed entry and the retry's optimizer start)
            assert ray_record["usage"].pop("replayed") > 0 == local_record["usage"].pop("replayed")
            assert ray_record.pop("ledger_entries") == local_record.pop("ledger_entries") + 2
            kinds = [e["kind"] for e in read_entries(ray_dir / LEDGER_FILE)[0]]
            assert kinds.count("session_resumed") == 1
        assert ray_record == local_record, (cell, f"failed in one run only: {diverged}")


def trimmed_record(run_dir: Path, resumed: bool = False) -> dict:
    """A run record without its timings and, for a cell resumed from its ledger, without what the
    resume itself adds (the replay count and the resume's ledger entries)."""
    record = without_timings(json.loads((run_dir / RECORD_FILE).read_text()))
    record["usage"].pop("replayed", None)
    record.pop("ledger_entries", None)
    return record


def test_the_users_optimizer_module_reaches_nodes_that_do_not_have_it(cluster, tmp_path, monkeypatch):
    source = tmp_path / "driver-only"
    source.mkdir()
    (source / f"{DRIVER_ONLY_MODULE}.py").write_text(DRIVER_ONLY_SOURCE)
    monkeypatch.syspath_prepend(str(source))  # the driver's path; no node's PYTHONPATH names it
    cell = Cell("lockpicking/six", Method("driver-only", target=f"{DRIVER_ONLY_MODULE}:optimize"), seed=0, budget=8)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        finds = ray.remote(num_cpus=1)(lambda: importlib.util.find_spec(DRIVER_ONLY_MODULE) is not None)
        assert ray.get([finds.remote() for _ in range(2)]) == [False, False]  # not there without shipping
    finally:
        ray.shutdown()
    executor = RayExecutor(tmp_path / "ray", address=cluster.address)
    try:  # isolated (the default for user code): the node's sandbox mounts the shipped file
        summary = run_study([cell], StudyConfig(run_root=str(tmp_path / "ray")), executor, progress=False)[0]
    finally:
        executor.close()
    assert summary["status"] == "ok", summary["error"]
    run_study([cell], StudyConfig(run_root=str(tmp_path / "local")), LocalExecutor(1), progress=False)
    shipped, here = (RunRecord.load(cell.run_dir(tmp_path / root)) for root in ("ray", "local"))
    assert shipped.usage["metric_calls"] == 4 and shipped.final_candidate == here.final_candidate
    assert shipped.experiment["optimizer"]["code_sha256"] == here.experiment["optimizer"]["code_sha256"]


NEW_RAY = """
import json, sys
from heldout.protocols.executors import RayExecutor
executor = RayExecutor(sys.argv[1])
try:
    print(json.dumps([node["NodeID"] for node in executor.connect().nodes()]))
finally:
    executor.close()
"""


def test_with_no_address_a_study_starts_its_own_ray_not_the_cluster_running_here(cluster, tmp_path):
    # Ray's own default joins the cluster this machine started last (this module's is running); a
    # driver process of its own, as a user's `heldout run --executor ray` is
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", NEW_RAY, str(tmp_path / "ray")], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    joined = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert joined and not joined & {node.node_id for node in [cluster.head_node, *cluster.worker_nodes]}


def weak_node_cases(tmp_path: Path) -> dict[str, tuple[dict[str, str], str]]:
    other_key = tmp_path / "other-ledger.key"
    other_key.write_text(os.urandom(32).hex())
    return {"isolation lowered": ({ISOLATION_ENV: "none"}, f"sandbox isolation none (driver: {isolation_level()})"),
            "data dir missing": ({DATA_DIR_ENV: str(tmp_path / "missing")},
                                 f"data dir {tmp_path / 'missing'} does not exist there"),
            "another ledger key": ({KEY_ENV: str(other_key)}, "a ledger key that is not the driver's")}


@pytest.mark.parametrize("case", ["isolation lowered", "data dir missing", "another ledger key"])
def test_a_node_with_weaker_containment_is_refused_before_any_cell_runs(cluster, tmp_path, monkeypatch, case):
    if case == "isolation lowered" and isolation_level() == "none":
        pytest.skip("no sandbox on this machine: nothing is weaker than the driver's isolation")
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)  # the node's own data dir is what a cell there reads
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    ledger_key(create=True)  # the driver anchors heads under its key
    env, weaker = weak_node_cases(tmp_path)[case]
    weak = cluster.add_node(**NODE, env_vars=env)
    cluster.wait_for_nodes()
    executor = RayExecutor(tmp_path / "runs", address=cluster.address)
    try:
        with pytest.raises(ExecutorError) as refused:
            run_study([Cell("lockpicking/six", Method("seed"), seed=0, budget=8)],
                      StudyConfig(run_root=str(tmp_path / "runs")), executor, progress=False)
    finally:
        executor.close()
        cluster.remove_node(weak)
    message = str(refused.value)
    assert "\n" not in message and weak.node_id[:12] in message and weaker in message
    assert message.count("node ") == 1  # the two healthy nodes are not named
    assert not (tmp_path / "runs").exists()  # refused before any cell: nothing written


def test_a_cell_on_a_node_weaker_than_the_driver_is_refused_before_anything_of_it_runs(tmp_path):
    # the start-up check sees the nodes alive when the study starts; a node that joins later (an
    # autoscaled worker) is checked by each cell on its own node: here, a driver whose ledger key
    # this node does not hold, and one that names a data dir missing here
    ledger_key(create=True)
    here = node_containment(None)
    ran: list[Cell] = []
    cell = Cell("lockpicking/six", Method("seed"), seed=0, budget=8)
    for driver, weaker in (({**here, "ledger_key_id": "0" * 16}, "a ledger key that is not the driver's"),
                           (None, None)):
        summary = run_locked_cell(lambda c: ran.append(c) or {"status": "ok"}, cell, str(tmp_path / "runs"), driver)
        if weaker:
            assert summary["status"] == "refused" and weaker in summary["error"] and ran == []
            assert not (tmp_path / "runs").exists()  # no lock, no run dir: nothing of the cell ran
        else:
            assert ran == [cell]  # without a driver report (or on an equal node) the cell runs


def test_a_ray_cells_response_cache_is_on_its_node_not_under_the_run_root(cluster, tmp_path, data_dir):
    cell = Cell("bbh/boolean_expressions", Method("seed"), seed=0, budget=8, profile="cpu-demo")
    root = tmp_path / "runs"
    with TestServer() as server:
        config = StudyConfig(run_root=str(root), data_dir=str(data_dir), worker_model="heldout-test",
                             base_url=server.base_url, cache_dir=str(root / "response-cache"))  # as asked: inside the shared run root
        executor = RayExecutor(root, address=cluster.address)
        try:
            summary = run_study([cell], config, executor, progress=False)[0]
        finally:
            executor.close()
        local = run_study([cell], StudyConfig(**{**config.__dict__, "run_root": str(tmp_path / "local"),
                                                 "cache_dir": str(tmp_path / "local-cache")}),
                          LocalExecutor(1), progress=False)[0]
    assert summary["status"] == "ok" and summary["test_score"] == local["test_score"]
    assert not list(root.rglob(ResponseCache.FILENAME + "*"))
    on_node = list(Path(os.environ[NODE_CACHE_ENV]).rglob(ResponseCache.FILENAME))
    assert len(on_node) == 1 and on_node[0].stat().st_size > 0
