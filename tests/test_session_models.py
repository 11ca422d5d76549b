"""A session's models: chat clients (heldout.models.ChatClient), grouped in SessionModels and
checked when the session is made, so a model that cannot answer is the harness's configuration
error, never an optimizer's failure; a local function (FunctionWorker) is such a model."""

from __future__ import annotations

import pytest

import heldout
from heldout.contracts import Completion, HeldoutError, InfrastructureFailure
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.records import RECORD_FILE
from heldout.evaluators.scoring import Execution, SessionModels
from heldout.evaluators.session import Session
from heldout.models import ModelError
from heldout.models.workers import FunctionWorker


@pytest.fixture(scope="module")
def word_sorting(data_dir):
    return heldout.load_task("bbh/word_sorting", profile="sepo", data_dir=data_dir)


def sort_the_list(prompt: str) -> str:
    """What a perfect word-sorting model answers: the words after the last ``List:``, sorted."""
    words = prompt.split("List:")[-1].split("\n")[0].split()
    return f"So the answer is {' '.join(sorted(words))}."


class TaskWorkerOnly:
    """A task's worker (contracts.Worker: ``complete``) but not a chat client: the shape that used
    to reach a session and fail inside the optimizer as an AttributeError."""

    model = "task-worker"

    def complete(self, messages):
        return Completion(text="x")


def test_a_function_model_drives_a_session_to_a_scored_record(word_sorting, tmp_path):
    def optimizer(view, seed):
        shown = view.evaluate(view.seed_candidate, "train", [ex["id"] for ex in view.train[:5]])
        assert [r["score"] for r in shown] == [1.0] * 5
        return view.seed_candidate

    record = Session(word_sorting, budget=5, run_dir=tmp_path,
                     models=SessionModels(worker=FunctionWorker(sort_the_list))).run(optimizer)
    assert record.status == "ok" and record.test_score == 1.0 and len(record.test_verdicts) == 200
    # the function is the endpoint: one call per example, no tokens reported
    assert record.usage["endpoint_calls"] == {"worker-optimisation": 5, "worker-deployment": 200}
    assert record.usage["tokens"]["worker-deployment"] == {"prompt": 0, "completion": 0}
    assert record.experiment["worker"]["client"] == "FunctionWorker"


@pytest.mark.parametrize("role", ["worker", "architect", "judge", "deployment_worker"])
def test_a_model_that_is_not_a_chat_client_is_one_configuration_error(role, word_sorting, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(ModelError, match=rf"the {role.replace('_', ' ')} model \(TaskWorkerOnly\) has no "
                                         r"a `complete_many\(") as caught:
        Session(word_sorting, budget=5, run_dir=run_dir, models=SessionModels(**{role: TaskWorkerOnly()}))
    assert caught.value.kind == "config" and "optimizer" not in str(caught.value)
    assert not run_dir.exists()  # refused before the session wrote anything


def test_a_model_without_a_name_is_refused_naming_the_name():
    with pytest.raises(ModelError, match=r"the worker model \(FunctionWorker\) has no a `model` name"):
        SessionModels(worker=FunctionWorker(sort_the_list, model=""))


def test_models_are_given_as_session_models_not_a_bare_client(word_sorting, tmp_path):
    with pytest.raises(HeldoutError, match=r"models must be SessionModels\(worker=..., architect=...\), got "
                                           "FunctionWorker"):
        Session(word_sorting, budget=5, run_dir=tmp_path / "run", models=FunctionWorker(sort_the_list))
    assert not (tmp_path / "run").exists()


def test_a_function_model_that_raises_ends_the_session_incomplete_and_blames_no_optimizer(word_sorting, tmp_path):
    def broken(prompt: str) -> str:
        raise ConnectionError("the local model crashed")

    session = Session(word_sorting, budget=5, run_dir=tmp_path,
                      models=SessionModels(worker=FunctionWorker(broken)))
    with pytest.raises(InfrastructureFailure, match="incomplete .*the local model crashed"):
        session.run(lambda view, seed: view.evaluate(view.seed_candidate, "train", [view.train[0]["id"]]))
    kinds = [e["kind"] for e in Ledger.open(tmp_path).entries()]
    assert "infrastructure_failure" in kinds and "optimizer_failed" not in kinds
    assert not (tmp_path / RECORD_FILE).exists()


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True])
def test_execution_jobs_is_a_positive_int(jobs):
    with pytest.raises(HeldoutError, match="jobs is how many executions run at once"):
        Execution(jobs=jobs)


def test_the_public_api_names_the_groups():
    assert heldout.SessionModels is SessionModels and heldout.Execution is Execution
