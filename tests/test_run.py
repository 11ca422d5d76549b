"""The replication runner and the reference optimizers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from heldout.evaluators.ledger import verify_ledger
from heldout.evaluators.records import RunRecord
from heldout.protocols.run import (
    Cell,
    LocalExecutor,
    Method,
    StudyConfig,
    build_cells,
    parse_budgets,
    parse_methods,
    run_study,
)
from heldout.contracts import HeldoutError


def test_methods_and_budgets_parse_with_clear_errors():
    methods = parse_methods(["seed", "mine=heldout.optimizers.seed:optimize"], ["iso=python x.py"])
    assert [m.name for m in methods] == ["seed", "mine", "iso"] and methods[2].command == "python x.py"
    assert parse_budgets(["100", "lockpicking/six=50"], ["a/b", "lockpicking/six"]) == {"a/b": 100, "lockpicking/six": 50}
    with pytest.raises(HeldoutError, match="unique"):
        parse_methods(["seed", "seed"], [])
    with pytest.raises(HeldoutError, match="no budget"):
        parse_budgets(["lockpicking/six=5"], ["lockpicking/six", "gsm_hard"])


def test_study_runs_every_cell_and_a_rerun_skips_finished_ones(tmp_path):
    cells = build_cells(["lockpicking/six"], parse_methods(["seed", "lockpicking-search"], []), [0, 1],
                        {"lockpicking/six": 200}, "paper", {})
    config = StudyConfig(run_root=str(tmp_path))
    first = run_study(cells, config, LocalExecutor(2), progress=False)
    assert len(first) == 4 and all(r["status"] == "ok" and not r["skipped"] for r in first)
    for cell in cells:
        record = RunRecord.load(cell.run_dir(tmp_path))
        assert record.usage["metric_calls"] <= 200 and verify_ledger(cell.run_dir(tmp_path)).ok
    search = [RunRecord.load(c.run_dir(tmp_path)) for c in cells if c.method.name == "lockpicking-search"]
    seed = [RunRecord.load(c.run_dir(tmp_path)) for c in cells if c.method.name == "seed"]
    assert min(r.test_score for r in search) > max(r.test_score for r in seed)
    again = run_study(cells, config, LocalExecutor(1), progress=False)
    assert all(r["skipped"] for r in again)


def test_an_interrupted_cell_resumes_from_its_ledger_without_double_counting(tmp_path):
    cell = Cell("lockpicking/six", Method("lockpicking-search"), seed=3, budget=300, profile="paper")
    config = StudyConfig(run_root=str(tmp_path))
    reference = run_study([cell], StudyConfig(run_root=str(tmp_path / "ref")), progress=False)[0]

    # Simulate a crash after some evaluations: run the same session but stop the optimizer early.
    from heldout.evaluators.session import Session
    from heldout.optimizers.lockpicking_search import optimize

    partial = Session("lockpicking/six", profile="paper", budget=300, seed=3, run_dir=cell.run_dir(tmp_path),
                      method="lockpicking-search")
    ids = [ex["id"] for ex in partial.view.train]
    partial.view.evaluate(partial.view.seed_candidate, "train", ids)  # what the optimizer does first
    partial.ledger.close()
    resumed = run_study([cell], config, progress=False)[0]
    assert resumed["test_score"] == reference["test_score"]
    a = RunRecord.load(cell.run_dir(tmp_path))
    b = RunRecord.load(cell.run_dir(tmp_path / "ref"))
    assert a.usage["metric_calls"] == b.usage["metric_calls"] and a.usage["replayed"] == len(ids)
    assert a.final_candidate == b.final_candidate and verify_ledger(cell.run_dir(tmp_path)).ok


def test_a_crashing_method_is_reported_not_raised(tmp_path):
    cells = [Cell("heilbronn/convex13", Method("local-search"), 0, 5)]  # no search for this task
    out = run_study(cells, StudyConfig(run_root=str(tmp_path)), progress=False)
    assert out[0]["status"] == "failed" and "no parameterisation" in out[0]["error"]


def test_cli_run_with_in_process_optimizers(tmp_path):
    res = subprocess.run([sys.executable, "-m", "heldout.cli", "run", "--task", "circle_packing/square26",
                          "--optimizer", "seed", "--optimizer", "geometry-search", "--seeds", "0",
                          "--budget", "6", "--run-dir", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = {r["method"]: r for r in json.loads(res.stdout)}
    assert rows["seed"]["test_score"] == pytest.approx(2.4975)
    assert rows["geometry-search"]["test_score"] > rows["seed"]["test_score"]
    assert (tmp_path / "study.json").exists()
