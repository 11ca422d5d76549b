"""A refused command writes nothing (issue 53): every check that can refuse a study (models for
prompt tasks, optimizers, method options, the executor's flags) answers before any file of it
exists, so the corrected command then runs in the same run dir instead of meeting the refused
one's leftovers as "another study"."""

from __future__ import annotations

import json
import os

import pytest

from heldout.cli import main
from heldout.evaluators.ledger import KEY_ENV, ledger_key
from heldout.models.testserver import TestServer

PROMPT_TASK = "bbh/boolean_expressions"


@pytest.fixture(scope="module")
def server():
    with TestServer(seed=0) as srv:
        yield srv


@pytest.fixture
def models(server):
    return ["--worker-model", "test-worker", "--architect-model", "test-architect", "--base-url", server.base_url]


def with_flag(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``flag``'s value replaced by ``value``."""
    at = args.index(flag) + 1
    return [*args[:at], value, *args[at + 1:]]


def refused(args: list[str], capsys, *, ray_logs: bool = False) -> str:
    """Run ``heldout ARGS``; it must be refused with one line (beside Ray's own log lines, when
    it connected to a cluster). Returns the line."""
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not (ray_logs and "\tINFO " in line)]
    assert len(lines) == 1 and lines[0].startswith("heldout: error: ") and "Traceback" not in err, err
    return lines[0]


def test_heldout_run_refused_for_a_missing_model_writes_nothing_and_the_corrected_command_runs(tmp_path, models,
                                                                                               capsys):
    run_dir = tmp_path / "study"
    study = ["-q", "run", "--task", PROMPT_TASK, "--optimizer", "seed", "--budget", "5", "--run-dir", str(run_dir)]
    line = refused(study, capsys)
    assert "is a prompt task" in line and "--worker-model" in line and "nothing was written" in line
    assert not run_dir.exists()
    assert main([*study, *models]) == 0
    assert (run_dir / "study.json").is_file()


@pytest.mark.parametrize("mistake, says", [
    (["--optimizer", "no-such-optimizer"], "unknown optimizer"),
    (["--optimizer", "local-search", "--method-option", "local-search.no_such_option=1"], "no_such_option"),
    (["--optimizer", "seed", "--ray-address", "127.0.0.1:6379"], "--ray-address needs --executor ray"),
    (["--optimizer", "seed", "--executor", "ray", "--cell-cpus", "0"], "positive CPU request"),
])
def test_heldout_run_refused_for_a_bad_flag_writes_nothing(tmp_path, capsys, mistake, says):
    run_dir = tmp_path / "study"
    line = refused(["run", "--task", "lockpicking/six", "--profile", "paper", "--budget", "5",
                    "--run-dir", str(run_dir), *mistake], capsys)
    assert says in line
    assert not run_dir.exists()


def test_a_refused_command_leaves_an_existing_study_exactly_as_it_was(tmp_path, capsys):
    run_dir = tmp_path / "study"
    study = ["-q", "run", "--task", "lockpicking/six", "--profile", "paper", "--optimizer", "seed", "--budget", "5",
             "--run-dir", str(run_dir)]
    assert main(study) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    refused([*study, "--resume", "--ray-address", "127.0.0.1:6379"], capsys)
    refused([*study, "--resume", "--optimizer", "no-such-optimizer"], capsys)
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_protocol_generalisation_refused_for_a_missing_model_writes_nothing_and_the_corrected_command_runs(
        tmp_path, models, capsys):
    run_dir = tmp_path / "protocol"
    # one placebo draw (of 7): what is tested is the refusals and that the corrected command runs
    protocol = ["-q", "protocol", "generalisation", "--task", PROMPT_TASK, "--profile", "default",
                "--allow-topic-shared", "--optimizer", "reflective", "--seeds", "0", "--budget", "16",
                "--placebo-draws", "1", "--run-dir", str(run_dir)]
    assert "is a prompt task" in refused(protocol, capsys)
    assert not run_dir.exists()
    assert "unknown optimizer" in refused(with_flag(protocol, "--optimizer", "no-such-optimizer"), capsys)
    assert not run_dir.exists()
    assert main([*protocol, *models]) == 0
    assert (run_dir / "report" / "generalisation.json").is_file()


def test_compare_verifiers_refused_for_a_missing_model_writes_nothing_and_the_corrected_command_runs(
        tmp_path, models, capsys):
    run_dir = tmp_path / "ablation"
    ablation = ["compare", "verifiers", "--task", PROMPT_TASK, "--optimizer", "reflective", "--variants", "scalar",
                "--seeds", "0", "--budget", "16", "--run-dir", str(run_dir)]
    assert "is a prompt task" in refused(ablation, capsys)
    assert not run_dir.exists()
    assert "unknown optimizer" in refused(with_flag(ablation, "--optimizer", "no-such-optimizer"), capsys)
    assert not run_dir.exists()
    assert main([*ablation, *models]) == 0
    assert (run_dir / "verifier_ablation.json").is_file()


def test_compare_arms_refused_for_a_missing_model_writes_nothing_and_the_corrected_command_runs(
        tmp_path, models, capsys):
    run_dir = tmp_path / "arms"
    arms = ["compare", "arms", "--task", PROMPT_TASK, "--optimizer", "reflective", "--budget", "32", "--width", "2",
            "--seeds", "0,1,2", "--run-dir", str(run_dir)]
    assert "is a prompt task" in refused(arms, capsys)
    assert not run_dir.exists()
    assert "no-such-optimizer" in refused(with_flag(arms, "--optimizer", "no-such-optimizer"), capsys)
    assert not run_dir.exists()
    assert main([*arms, *models, "--json"]) in (0, 1)  # 1: a comparison the data calls broken, still a comparison
    assert json.loads(capsys.readouterr().out)["rows"] and (run_dir / "arms_result.json").is_file()


def test_heldout_run_on_a_cluster_whose_node_is_refused_writes_nothing(tmp_path, capsys):
    cluster_utils = pytest.importorskip("ray.cluster_utils", reason="the [ray] extra is not installed")
    ledger_key(create=True)  # the driver anchors heads under its key; the node has another one
    other_key = tmp_path / "other-ledger.key"
    other_key.write_text(os.urandom(32).hex())
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "object_store_memory": 80 * 2**20})
    try:
        cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20, env_vars={KEY_ENV: str(other_key)})
        cluster.wait_for_nodes()
        run_dir = tmp_path / "study"
        line = refused(["run", "--task", "lockpicking/six", "--profile", "paper", "--optimizer", "seed",
                        "--budget", "5", "--executor", "ray", "--ray-address", cluster.address,
                        "--run-dir", str(run_dir)], capsys, ray_logs=True)
    finally:
        cluster.shutdown()
    assert "a ledger key that is not the driver's" in line
    assert not run_dir.exists()
