"""One decided value per cell: what a method runs (target, options, the user's code and its hash,
isolation, trust) is decided once when the study is made, shared by the method's cells, and read
by the runner, the executors and the run record, never asked for again. A file edited after the
study was made does not change what its cells say they run; trust comes from the person's flag."""

from __future__ import annotations

import hashlib

import pytest

from heldout.optimizers import registry
from heldout.optimizers.resolved import ISOLATED, TRUSTED, resolve_method
from heldout.protocols.executors import shipped_modules
from heldout.protocols.run import StudyConfig, cell_is_isolated, cell_method, cell_settings
from heldout.protocols.study import make_study, parse_methods, parse_method_options

OPTIMIZER = "def optimize(view, seed, width=1):\n    return view.seed_candidate\n"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text(OPTIMIZER)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def study(folder, trusted: bool):
    methods = parse_method_options(parse_methods(["mine=mine:optimize", "seed"], []), ["mine.width=2"])
    return make_study(run_dir=str(folder / "study"), tasks=["lockpicking/six"], budgets={"lockpicking/six": 4},
                      methods=methods, profiles=["paper"], seeds=[0, 1, 2], verifiers=["decomposed"],
                      policy="standard", options={}, limits={}, models={}, executor={}, data_dir=None,
                      allow_drift=False, trusted_optimizer=trusted, origin="heldout run")


def test_each_method_is_decided_once_and_its_cells_share_the_decision(folder):
    made = study(folder, trusted=False)
    cells = made.cells()
    mine = [c for c in cells if c.method.name == "mine"]
    assert len(mine) == 3 and all(c.resolved is mine[0].resolved for c in mine)
    decided = mine[0].resolved
    assert decided.target == "mine:optimize" and decided.options == {"width": 2}
    assert decided.code_sha256 == hashlib.sha256(OPTIMIZER.encode()).hexdigest()
    assert decided.user_code and decided.isolated and decided.isolation == ISOLATED
    assert [m.file for m in decided.modules] == [folder / "mine.py"]
    seed = next(c for c in cells if c.method.name == "seed").resolved
    assert not seed.user_code and not seed.isolated and seed.isolation == TRUSTED and seed.modules == ()


def test_a_file_edited_after_the_study_was_made_does_not_change_what_its_cells_say(folder):
    cells = study(folder, trusted=False).cells()
    (folder / "mine.py").write_text(OPTIMIZER + "# edited\n")
    config = StudyConfig(run_root=str(folder / "study"))
    cell = next(c for c in cells if c.method.name == "mine")
    assert cell_settings(cell, config)["optimizer code"] == hashlib.sha256(OPTIMIZER.encode()).hexdigest()
    assert cell.method.describe()["code_sha256"] != cell_settings(cell, config)["optimizer code"]  # asked anew


def test_trust_is_the_persons_and_a_changed_grant_is_decided_again(folder):
    made = study(folder, trusted=False)
    assert all(not c.resolved.trusted for c in made.cells())
    made.config.trusted_optimizer = True  # the flag applied to a study read from a file
    cells = made.cells()
    mine = next(c for c in cells if c.method.name == "mine")
    assert mine.resolved.trusted and not mine.resolved.isolated
    assert not cell_is_isolated(mine, made.config) and cell_method(mine, made.config) is mine.resolved


def test_the_executors_ship_the_decided_modules(folder):
    cells = study(folder, trusted=False).cells()
    assert shipped_modules(cells) == [str(folder / "mine.py")]


def test_a_command_is_decided_with_the_hash_of_its_files(folder):
    decided = resolve_method("cmd", command="python mine.py")
    assert decided.isolated and decided.describe()["command"] == "python mine.py"
    assert decided.code_sha256 == hashlib.sha256(b"python mine.py" + OPTIMIZER.encode()).hexdigest()


def test_a_cell_whose_code_changed_after_the_study_was_made_does_not_run_under_the_old_hash(folder):
    from heldout.evaluators.records import RunRecord
    from heldout.protocols.run import run_cell
    made = study(folder, trusted=True)  # in-process: the test needs no sandbox
    cell = next(c for c in made.cells() if c.method.name == "mine")
    (folder / "mine.py").write_text(OPTIMIZER.replace("return view.seed_candidate", "raise SystemExit('new code')"))
    summary = run_cell(cell, made.groups()[0][0])
    assert summary["status"] == "failed" and "code changed after the study was made" in summary["error"]
    record = RunRecord.load(cell.run_dir(made.run_dir))
    assert record.experiment["optimizer"]["code_sha256"] == hashlib.sha256(OPTIMIZER.encode()).hexdigest()


def test_a_name_that_names_other_code_than_when_the_study_was_made_does_not_run(monkeypatch):
    """An in-process cell loads what its name names when it runs: a plugin upgraded after the
    study was made may map the same name to another function, whose file hashes alike or not."""
    decided = resolve_method("seed")
    assert decided.code_changed() is None
    monkeypatch.setitem(registry.REFERENCE_OPTIMIZERS, "seed", "heldout.optimizers.placebo:optimize")
    why = decided.code_changed()
    assert why and "heldout.optimizers.placebo:optimize" in why and "start a new study" in why
