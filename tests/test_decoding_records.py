"""Task options and decoding, stated apart in the ledger's session_start and the run record, and
run dirs written before they were (one combined ``options`` mapping) still resuming, verifying and
reporting.

``fixtures/options_with_decoding`` was written by heldout at commit 8cc5cb4 (the last before the
split): bbh/boolean_expressions [cpu-demo], seed 0, method "seed", budget 4, a function model
"old-form" answering "So the answer is True.", and
``options={"temperature": 0.5, "max_tokens": 32, "judge_temperature": 0.25}``. ``finished`` is a
finished run; ``incomplete`` stopped while its final candidate was scored on test (the model raised
after its 4 training calls), so it resumes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from heldout.contracts import HeldoutError, InfrastructureFailure
from heldout.evaluators.authenticity import Authenticity
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.records import RunRecord, anchor_problem
from heldout.evaluators.same_experiment import ExperimentMismatch, experiment_differences, split_experiment
from heldout.evaluators.scoring import Decoding, SessionModels
from heldout.evaluators.session import Budget, Session
from heldout.evaluators.signing import TrustedSigners
from heldout.models.workers import FunctionWorker
from heldout.protocols.leakage import rec_options
from heldout.protocols.run import Cell, Method, StudyConfig, build_cells, cell_settings, finished_summary
from heldout.protocols.study_dir import STUDY_FILE, open_study, study_description
from heldout.reports.collect import collect_runs
from heldout.reports.render import provenance_lines
from heldout.reports.verify import verify_run_dir

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "options_with_decoding"
TASK, PROFILE, MODEL = "bbh/boolean_expressions", "cpu-demo", "old-form"
OLD_OPTIONS = {"temperature": 0.5, "max_tokens": 32, "judge_temperature": 0.25}
OLD_DECODING = Decoding(temperature=0.5, max_tokens=32, judge_temperature=0.25)


def answer_true(prompt: str) -> str:
    return "So the answer is True."


def four_training_calls(view, seed):
    view.evaluate(view.seed_candidate, "train", [ex["id"] for ex in view.train[:4]])
    return view.seed_candidate


@pytest.fixture
def old_runs(tmp_path) -> Path:
    """A writable copy of the fixture (a resumed session appends to its ledger)."""
    copy = tmp_path / "old"
    shutil.copytree(FIXTURE, copy)
    for path in copy.rglob("*"):
        path.chmod(0o700 if path.is_dir() else 0o600)
    return copy


def session(run_dir: Path, decoding: Decoding, data_dir, options=None) -> Session:
    return Session(TASK, profile=PROFILE, budget=Budget(4), seed=0, run_dir=run_dir, method="seed", data_dir=data_dir,
                   models=SessionModels(worker=FunctionWorker(answer_true, MODEL)), decoding=decoding, options=options)


def start_of(run_dir: Path) -> dict:
    ledger = Ledger.open(run_dir)
    try:
        return next(e["data"] for e in ledger.entries("session_start"))
    finally:
        ledger.close()


def test_a_new_session_start_states_task_options_and_decoding_apart(tmp_path, data_dir):
    record = session(tmp_path / "run", OLD_DECODING, data_dir).run(four_training_calls)
    start = start_of(tmp_path / "run")
    assert start["options"] == record.options == record.task_options == {}
    assert start["decoding"]["stated"] == record.decoding == {"temperature": 0.5, "max_tokens": 32,
                                                              "judge_temperature": 0.25, "judge_max_tokens": None}
    # what the requests carried: the stated values, the task's stop sequences, the judge's own
    assert start["decoding"]["sent"]["temperature"] == 0.5 and start["decoding"]["sent"]["max_tokens"] == 32
    assert start["decoding"]["sent"]["judge_temperature"] == 0.25


def test_an_unstated_decoding_is_recorded_as_the_tasks_prompt_setting_sends_it(tmp_path, data_dir):
    one = session(tmp_path / "run", None, data_dir)
    setting = one.task.benchmark.prompt_setting(None)
    sent = one.header()["decoding"]["sent"]
    one.ledger.close()
    assert (sent["temperature"], sent["max_tokens"]) == (setting.temperature, setting.max_tokens)
    assert one.header()["decoding"]["stated"] == {"temperature": None, "max_tokens": None,
                                                  "judge_temperature": 0.0, "judge_max_tokens": None}


def test_an_old_finished_run_verifies_and_reads_its_decoding_apart_from_its_task_options(old_runs):
    run_dir = old_runs / "finished"
    record = RunRecord.load(run_dir)
    assert record.options == OLD_OPTIONS  # as written: the record's digest covers it
    assert record.task_options == {}
    assert record.decoding == {"temperature": 0.5, "max_tokens": 32, "judge_temperature": 0.25, "judge_max_tokens": None}
    verified = verify_run_dir(run_dir, TrustedSigners())
    assert verified.differences == [] and verified.notes == []
    assert verified.authenticity.status is Authenticity.UNTRUSTED  # signed, by a key nobody here trusts: not TAMPERED
    ledger = Ledger.open(run_dir)
    try:
        assert anchor_problem(record, list(ledger.entries()), ledger.head, run_dir) is None
    finally:
        ledger.close()


def test_an_old_finished_run_is_reported(old_runs):
    runs = collect_runs([old_runs / "finished"])
    assert [r.record.test_score for r in runs.runs] == [RunRecord.load(old_runs / "finished").test_score]
    assert not runs.excluded


def test_a_study_keeps_an_old_finished_run_of_the_same_decoding_and_refuses_one_of_another(old_runs):
    """finished_summary compares task options and decoding apart, an old record's split from its options."""
    config = StudyConfig(str(old_runs), worker_model=MODEL)
    same = Cell(TASK, Method("seed"), 0, 4, PROFILE, decoding=OLD_DECODING)
    wanted = {k: v for k, v in cell_settings(same, config).items()
              if k in ("task", "profile", "seed", "method", "options", "decoding", "worker")}
    assert finished_summary(old_runs / "finished", wanted)["skipped"]
    hotter = {**wanted, "decoding": {**wanted["decoding"], "temperature": 0.9}}
    with pytest.raises(ExperimentMismatch, match="decoding: .*0.5.* -> .*0.9"):
        finished_summary(old_runs / "finished", hotter)
    with pytest.raises(ExperimentMismatch, match="options: {} -> "):
        finished_summary(old_runs / "finished", {**wanted, "options": {"prompt_format": "zero_shot"}})


def test_an_old_incomplete_run_resumes_under_the_same_decoding_stated_apart(old_runs, data_dir):
    run_dir = old_runs / "incomplete"
    resumed = session(run_dir, OLD_DECODING, data_dir)
    assert resumed.resumed
    record = resumed.run(four_training_calls)
    assert record.status == "ok" and record.usage["replayed"] == 4 and record.usage["metric_calls"] == 4
    assert len(record.test_verdicts) == 24
    assert record.task_options == {} and record.decoding["temperature"] == 0.5
    verified = verify_run_dir(run_dir, TrustedSigners())
    assert verified.differences == [] and verified.authenticity.status is Authenticity.UNTRUSTED


@pytest.mark.parametrize("decoding, options, named", [
    (Decoding(temperature=0.9, max_tokens=32, judge_temperature=0.25), None, "decoding.stated"),
    (Decoding(temperature=0.5, max_tokens=32), None, "decoding.sent"),  # the judge's temperature
    (OLD_DECODING, {"prompt_format": "zero_shot"}, "options.prompt_format")])
def test_an_old_incomplete_run_refuses_another_decoding_or_other_task_options(old_runs, data_dir, decoding, options,
                                                                             named):
    run_dir = old_runs / "incomplete"
    before = (run_dir / "ledger.jsonl").read_bytes()
    with pytest.raises(ExperimentMismatch, match=named.replace(".", r"\.")):
        session(run_dir, decoding, data_dir, options)
    assert (run_dir / "ledger.jsonl").read_bytes() == before


def test_an_old_header_reads_as_the_new_form_and_a_new_one_as_itself(old_runs, data_dir, tmp_path):
    old = start_of(old_runs / "incomplete")
    assert set(json.loads(json.dumps(old["options"]))) == set(OLD_OPTIONS)  # the fixture is the old form
    new = session(tmp_path / "run", OLD_DECODING, data_dir)
    now = new.header()
    new.ledger.close()
    assert split_experiment(now) == now
    assert split_experiment(old)["options"] == now["options"] == {}
    assert split_experiment(old)["decoding"] == now["decoding"]
    assert experiment_differences(old, now) == []


def test_a_resumed_old_run_that_fails_again_stays_resumable(old_runs, data_dir):
    run_dir = old_runs / "incomplete"
    broken = Session(TASK, profile=PROFILE, budget=Budget(4), seed=0, run_dir=run_dir, method="seed", data_dir=data_dir,
                     models=SessionModels(worker=FunctionWorker(lambda p: 1 / 0, MODEL)), decoding=OLD_DECODING)
    with pytest.raises(InfrastructureFailure):
        broken.run(four_training_calls)
    assert session(run_dir, OLD_DECODING, data_dir).run(four_training_calls).status == "ok"


def test_a_rescoring_of_a_run_decodes_as_the_run_did_whichever_heldout_wrote_its_record(old_runs, data_dir, tmp_path):
    """An ablation, a recipe baseline or a re-run cell reads a record's options as a study states
    them: split again, they are the run's task options and decoding (a new record keeps its
    decoding apart from ``options``, which alone would lose it)."""
    new = session(tmp_path / "run", OLD_DECODING, data_dir, {"prompt_format": "zero_shot"}).run(four_training_calls)
    old = RunRecord.load(old_runs / "finished")
    assert Decoding.split(new.options_as_stated) == (OLD_DECODING, {"prompt_format": "zero_shot"})
    assert Decoding.split(old.options_as_stated) == (OLD_DECODING, {})
    assert rec_options([new], TASK) == new.options_as_stated


def test_a_cell_carries_task_options_and_decoding_apart_split_once_where_cells_are_made():
    (cell,) = build_cells([TASK], [Method("seed")], [0], {TASK: 4}, PROFILE, {"tolerance": 1, **OLD_OPTIONS})
    assert cell.options == {"tolerance": 1} and cell.decoding == OLD_DECODING
    with pytest.raises(HeldoutError, match=r"cell options temperature are decoding settings.*decoding=Decoding"):
        Cell(TASK, Method("seed"), 0, 4, PROFILE, {"temperature": 0.5})


def test_a_study_json_written_before_cells_carried_decoding_still_resumes(tmp_path):
    """The old ``study.json`` had one combined ``options`` list and no ``decoding``."""
    cells = build_cells([TASK], [Method("seed")], [0, 1], {TASK: 4}, PROFILE, {"tolerance": 1, **OLD_OPTIONS})
    config = StudyConfig(str(tmp_path / "study"), worker_model=MODEL)
    old = study_description(cells, config)
    old["options"] = [{"tolerance": 1, **OLD_OPTIONS}]
    del old["decoding"]
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / STUDY_FILE).write_text(json.dumps(old))
    assert open_study(cells, config, resume=True) == tmp_path / "study" / STUDY_FILE
    hotter = build_cells([TASK], [Method("seed")], [0, 1], {TASK: 4}, PROFILE, {**OLD_OPTIONS, "temperature": 0.9})
    with pytest.raises(ExperimentMismatch, match="decoding: .*0.5.* -> .*0.9"):
        open_study(hotter, StudyConfig(str(tmp_path / "study"), worker_model=MODEL), resume=True)


def test_a_report_states_one_decoding_for_an_old_and_a_new_run_that_sent_the_same(old_runs, data_dir):
    session(old_runs / "new", OLD_DECODING, data_dir).run(four_training_calls)
    (decoding,) = [line for line in provenance_lines(collect_runs([old_runs / "finished", old_runs / "new"]))
                   if "Decoding:" in line]
    sent = decoding.split("Decoding: ")[1].split("}")[0] + "}"
    assert json.loads(sent) == {"temperature": 0.5, "max_tokens": 32, "judge_temperature": 0.25,
                                "judge_max_tokens": None}  # one value: both runs sent it
    assert decoding.count("{") == 1
