"""Minimum useful budgets (issue 58): every heldout optimizer states, as a number, the fewest metric
calls in which it can judge one candidate other than the seed against it. One rule for all of them:
a study whose budget is below a method's minimum is refused before any file of it exists (one
line, exit 2), whatever command makes it; and a library adapter handed less at run time (the
Python API) fails its cell with BudgetTooSmall, so no cell ends ``ok`` on the seed's score.

The report states, per method, which split selected the final candidate and what the library could
not make reproducible (each optimizer's own statement, kept in its run record)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

import heldout
from heldout.cli import main
from heldout.contracts import HeldoutError
from heldout.evaluators.ledger import LEDGER_FILE
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient
from heldout.models.testserver import TestServer
from heldout.optimizers import resolve_optimizer
from heldout.optimizers.minimums import minimum_budget

LIBRARY = {"gepa": "gepa", "dspy-gepa": "dspy", "dspy-mipro": "dspy", "openevolve": "openevolve"}

# (optimizer, task, profile sizes (train, val), the minimum as docs/plug-an-optimizer.md states it)
STATED = [
    ("seed", "bbh/word_sorting", (50, 50), 0),  # the baseline spends nothing, by design
    ("reflective", "bbh/word_sorting", (50, 50), 16),  # the instruction and one rewrite on a minibatch of 8
    ("local-search", "lockpicking/six", (50, 0), 20),  # a start and one move on a minibatch of 10
    ("local-search?width=2", "lockpicking/six", (50, 0), 100),  # the width search scores all of train
    ("local-search", "circle_packing/square26", (1, 0), 2),
    ("constant-search", "circle_packing/square26", (1, 0), 2),
    ("gepa", "bbh/word_sorting", (50, 50), 106),  # seed and child on 50 val, parent and child on 3 train
    ("gepa", "bbh/word_sorting", (50, 0), 106),  # no val split: GEPA validates on train
    ("dspy-gepa", "bbh/word_sorting", (50, 50), 8),  # seed and child on 1 val example, 2 x 3 on a minibatch
    ("dspy-mipro", "bbh/word_sorting", (50, 50), 205),  # bootstrap over 50 train + 155 for one trial
    ("dspy-mipro?zero_shot=true", "bbh/word_sorting", (50, 50), 205),  # it bootstraps for its proposer too
    ("dspy-mipro?max_bootstrapped_demos=0", "bbh/word_sorting", (50, 50), 155),  # labeled demos only: free
    ("openevolve", "circle_packing/square26", (1, 0), 2),  # the seed and one child, each on train + val
]


def needs_library(optimizer: str) -> None:
    library = LIBRARY.get(optimizer.partition("?")[0])
    if library:
        pytest.importorskip(library, reason=f"the [{library}] extra is not installed (CI installs it)")
        if library == "dspy":
            pytest.importorskip("optuna", reason="MIPROv2 needs optuna (the [dspy] extra installs it)")


@pytest.mark.parametrize("optimizer, task, sizes, stated", STATED)
def test_every_optimizer_states_its_minimum_as_a_number(optimizer, task, sizes, stated):
    needs_library(optimizer)
    assert minimum_budget(optimizer, None, task, *sizes) == stated


def test_user_code_states_no_minimum_and_a_contradictory_zero_shot_is_refused():
    assert minimum_budget("my_module:optimize", None, "bbh/word_sorting", 50, 50) is None
    needs_library("dspy-mipro")
    with pytest.raises(HeldoutError, match="zero_shot=true proposes no demos"):
        minimum_budget("dspy-mipro", {"zero_shot": "true", "max_labeled_demos": "2"}, "bbh/word_sorting", 50, 50)


@pytest.fixture(scope="module")
def server():
    with TestServer(seed=0) as srv:
        yield srv


def refused(args: list[str], capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("heldout: error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("optimizer, task, sizes, stated", [s for s in STATED if s[3] and s[2][1] == 50 or
                                                            s[0] in ("local-search", "openevolve")])
def test_a_study_below_the_minimum_is_refused_in_one_line_and_writes_nothing(optimizer, task, sizes, stated, server,
                                                                             tmp_path, capsys):
    needs_library(optimizer)
    run_dir = tmp_path / "study"
    study = ["-q", "run", "--task", task, "--optimizer", optimizer, "--run-dir", str(run_dir),
             "--worker-model", "w", "--architect-model", "a", "--base-url", server.base_url]
    for command in ([*study, "--budget", str(stated - 1)], [*study, "--budget", str(stated - 1), "--dry-run"]):
        line = refused(command, capsys)
        assert f"minimum useful budget of {stated} metric calls" in line and "nothing was run or written" in line
        assert not run_dir.exists()
    assert main([*study, "--budget", str(stated), "--dry-run"]) == 0  # the minimum itself is accepted


def test_the_minimum_counts_every_metric_call_a_verifier_charges(server, tmp_path, capsys):
    needs_library("dspy-gepa")
    study = ["-q", "run", "--task", "bbh/word_sorting", "--optimizer", "dspy-gepa", "--verifier", "repeated:3",
             "--run-dir", str(tmp_path / "study"), "--worker-model", "w", "--base-url", server.base_url]
    line = refused([*study, "--budget", "23"], capsys)
    assert "minimum useful budget of 24 metric calls (8 program calls x 3 under --verifier repeated:3)" in line
    assert main([*study, "--budget", "24", "--dry-run"]) == 0


def test_a_study_file_below_the_minimum_is_refused_too(tmp_path, capsys):
    path = tmp_path / "study.toml"
    path.write_text('run_dir = "%s"\ntasks = ["lockpicking/six"]\nseeds = [0]\nbudget = 19\n'
                    '[[methods]]\nname = "local-search"\n' % (tmp_path / "runs"))
    line = refused(["-q", "run", str(path)], capsys)
    assert "local-search's minimum useful budget of 20 metric calls" in line
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def readable_dir():
    path = Path(tempfile.mkdtemp(prefix="heldout-test-minimum-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def prompt_session(task, server, run_dir: Path, budget: int, method: str) -> Session:
    run_dir.mkdir(mode=0o755)
    model = ModelClient("test", base_url=server.base_url, api_key="k")
    return Session(task, budget=Budget(budget, wall_seconds=600), seed=0, models=SessionModels(worker=model, architect=model),
                   run_dir=run_dir, method=method)


def evaluations(run_dir: Path) -> list[dict]:
    return [json.loads(line)["data"] for line in (run_dir / LEDGER_FILE).read_text().splitlines()
            if json.loads(line)["kind"] == "evaluation"]


@pytest.mark.parametrize("optimizer, budget", [("gepa", 105), ("dspy-gepa", 7), ("dspy-mipro", 204)])
def test_an_adapter_handed_less_than_its_minimum_fails_its_cell_and_spends_nothing(optimizer, budget, server,
                                                                                   readable_dir, data_dir):
    needs_library(optimizer)
    task = heldout.load_task("bbh/word_sorting", data_dir=data_dir)
    record = prompt_session(task, server, readable_dir / "run", budget, optimizer).run(resolve_optimizer(optimizer))
    assert record.status == "failed" and "BudgetTooSmall" in record.error, record.error
    assert f"at least {budget + 1} metric calls" in record.error
    assert evaluations(readable_dir / "run") == [] and record.test_score is None


@pytest.mark.parametrize("optimizer, minimum", [("gepa", 106), ("dspy-gepa", 8), ("reflective", 16)])
def test_at_its_minimum_a_method_judges_a_candidate_other_than_the_seed(optimizer, minimum, server, readable_dir,
                                                                        data_dir):
    needs_library(optimizer)
    task = heldout.load_task("bbh/word_sorting", data_dir=data_dir)
    record = prompt_session(task, server, readable_dir / "run", minimum, optimizer).run(resolve_optimizer(optimizer))
    assert record.status == "ok", record.error
    rows = evaluations(readable_dir / "run")
    assert len({r["candidate_id"] for r in rows}) >= 2 and len(rows) <= minimum


def test_the_report_states_the_selecting_split_and_what_is_not_reproducible_per_method(server, readable_dir, data_dir):
    """GEPA on a profile without val selects on train, and the record and report say so."""
    from heldout.reports.render import build_report
    needs_library("gepa")
    needs_library("openevolve")
    no_val = heldout.load_task("bbh/word_sorting", "sepo", data_dir=data_dir)
    for method, budget in (("seed", 1), ("gepa", 106)):
        record = prompt_session(no_val, server, readable_dir / method, budget, method).run(resolve_optimizer(method))
        assert record.status == "ok", record.error
    assert record.extra["selection"]["split"] == "train" and record.extra["not_reproducible"] is None
    (readable_dir / "openevolve").mkdir(mode=0o755)
    architect = ModelClient("test", base_url=server.base_url, api_key="k")
    oe = Session(heldout.load_task("circle_packing/square26"), budget=Budget(3, wall_seconds=600), seed=0,
                 models=SessionModels(architect=architect), run_dir=readable_dir / "openevolve", method="openevolve")
    assert oe.run(resolve_optimizer("openevolve")).status == "ok"
    report = build_report([readable_dir])
    table = report.table("selection")
    rows = {row["method"]: row for row in table.data}
    assert rows["gepa"]["selected_on"] == ["train"] and rows["seed"]["selected_on"] == ["none"]
    assert rows["openevolve"]["selected_on"] == ["train"] and "uuid4" in rows["openevolve"]["not_reproducible"][0]
    assert rows["gepa"]["not_reproducible"] == []


# -- the same rule in every command that plans cells: one line, exit 2, nothing written -------------
def test_compare_arms_refuses_a_fork_below_its_methods_minimum(tmp_path, capsys):
    """A fork gets B/N: at B = 200 over 4 forks each fork has 50 of the width search's 100 (2 x 50
    train) on lockpicking, while the serial and merge arms have enough."""
    run_dir = tmp_path / "arms"
    arms = ["-q", "compare", "arms", "--task", "lockpicking/six", "--optimizer", "local-search", "--width", "4",
            "--seeds", "0,1,2", "--run-dir", str(run_dir)]
    for command in ([*arms, "--budget", "200"], [*arms, "--budget", "200", "--plan"]):
        line = refused(command, capsys)
        assert line.startswith("heldout: error: compare arms: budget 50 for lockpicking/six"), line
        assert "local-search.fork-0-of-4's minimum useful budget of 100 metric calls" in line
        assert "nothing was run or written" in line and not run_dir.exists()
    assert main([*arms, "--budget", "400", "--plan"]) == 0  # 100 a fork: the minimum itself is accepted


def test_compare_verifiers_refuses_a_variant_whose_repeats_put_the_method_below_its_minimum(tmp_path, capsys,
                                                                                          data_dir, server):
    run_dir = tmp_path / "verifiers"
    ablation = ["-q", "compare", "verifiers", "--task", "bbh/word_sorting", "--optimizer", "reflective",
                "--variants", "decomposed,repeated:2", "--seeds", "0,1,2", "--run-dir", str(run_dir),
                "--data-dir", str(data_dir), "--worker-model", "w", "--base-url", server.base_url]
    for command in ([*ablation, "--budget", "31"], [*ablation, "--budget", "31", "--plan"]):
        line = refused(command, capsys)
        assert line.startswith("heldout: error: compare verifiers: budget 31 for bbh/word_sorting"), line
        assert "minimum useful budget of 32 metric calls (16 program calls x 2 under --verifier repeated:2)" in line
        assert not run_dir.exists()
    assert main([*ablation, "--budget", "32", "--plan"]) == 0


def test_protocol_generalisation_refuses_a_budget_below_the_methods_minimum(tmp_path, capsys, data_dir, server):
    run_dir = tmp_path / "protocol"
    protocol = ["-q", "protocol", "generalisation", "--task", "bbh/word_sorting", "--optimizer", "reflective",
                "--profile", "default", "--allow-topic-shared", "--seeds", "0,1,2", "--run-dir", str(run_dir),
                "--data-dir", str(data_dir), "--worker-model", "w", "--base-url", server.base_url]
    for command in ([*protocol, "--budget", "15"], [*protocol, "--budget", "15", "--plan"]):
        line = refused(command, capsys)
        assert line.startswith("heldout: error: protocol generalisation: budget 15 for bbh/word_sorting"), line
        assert "reflective's minimum useful budget of 16 metric calls" in line and not run_dir.exists()
    assert main([*protocol, "--budget", "16", "--plan"]) == 0


def test_leak_ablate_refuses_a_study_whose_runs_were_below_their_methods_minimum(readable_dir, capsys, data_dir,
                                                                                  server):
    """A study made through the Python API is not planned by a command: its run below the minimum
    ends ``ok`` on the seed's prompt, and the ablation would read the seed's luck as the method's."""
    from heldout.protocols.run import Cell, Method, StudyConfig, run_study
    study = readable_dir / "study"
    config = StudyConfig(run_root=str(study), data_dir=str(data_dir), worker_model="w", architect_model="w",
                         base_url=server.base_url)
    [summary] = run_study([Cell("bbh/word_sorting", Method("reflective", "reflective"), 0, 4)], config,
                          progress=False)
    assert summary["status"] == "ok"  # what the rule is for: the seed's score under the method's name
    before = sorted(p.relative_to(study) for p in study.rglob("*"))
    line = refused(["-q", "leak", "ablate", str(study), "--worker-model", "w", "--base-url", server.base_url,
                    "--data-dir", str(data_dir)], capsys)
    assert line.startswith("heldout: error: leak ablate: budget 4 for bbh/word_sorting"), line
    assert "reflective's minimum useful budget of 16 metric calls" in line and "re-run it with at least" in line
    assert sorted(p.relative_to(study) for p in study.rglob("*")) == before  # no ablation folder, no evidence
