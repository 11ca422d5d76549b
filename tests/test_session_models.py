"""A session's models: chat clients (heldout.models.ChatClient), grouped in SessionModels and
checked when the session is made, so a model that cannot answer is the harness's configuration
error, never an optimizer's failure; a local function (FunctionWorker) is such a model."""

from __future__ import annotations

import pytest

import heldout
from heldout.contracts import Completion, HeldoutError, InfrastructureFailure, Message
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.records import RECORD_FILE
from heldout.evaluators.policy import Usage
from heldout.evaluators.scoring import Decoding, Execution, Scorer, SessionModels
from heldout.evaluators.session import Session
from heldout.models import DEPLOYMENT, OPTIMISATION, ChatClient, ModelClient, ModelError
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
    with pytest.raises(ModelError, match=rf"the {role.replace('_', ' ')} model \(TaskWorkerOnly\) lacks "
                                         r"a `complete_many\(") as caught:
        Session(word_sorting, budget=5, run_dir=run_dir, models=SessionModels(**{role: TaskWorkerOnly()}))
    assert caught.value.kind == "config" and "optimizer" not in str(caught.value)
    assert not run_dir.exists()  # refused before the session wrote anything


def test_a_model_without_a_name_is_refused_naming_the_name():
    with pytest.raises(ModelError, match=r"the worker model \(FunctionWorker\) lacks a `model` name"):
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


class RecordingModel(FunctionWorker):
    """A local model that keeps every request it is sent (to read what the harness asked for)."""

    def __init__(self, answer: str = "So the answer is a.", model: str = "recording") -> None:
        super().__init__(lambda prompt: answer, model)
        self.requests = []

    def complete_many(self, requests, *, return_exceptions=False):
        self.requests += list(requests)
        return super().complete_many(requests, return_exceptions=return_exceptions)


def test_decoding_reaches_the_models_requests_and_never_the_tasks_options(word_sorting):
    worker, judge = RecordingModel(), RecordingModel(model="judge")
    options = {"temperature": 0.7, "max_tokens": 5, "judge_temperature": 0.3, "judge_max_tokens": 9,
               "prompt_format": "zero_shot"}
    scorer = Scorer(word_sorting.benchmark, worker, options=options, judge=judge)
    assert scorer.decoding == Decoding(0.7, 5, 0.3, 9) and scorer.options == {"prompt_format": "zero_shot"}
    context = scorer.context(DEPLOYMENT, Usage())
    assert dict(context.options) == {"prompt_format": "zero_shot"}  # what a task reads: task options only
    context.judge.complete([Message("user", "rate it")])
    (judged,) = judge.requests
    assert (judged.channel, judged.temperature, judged.max_tokens) == ("judge-deployment", 0.3, 9)
    scorer.score({"instruction": "Sort."}, word_sorting.splits["train"][:2], OPTIMISATION, Usage())
    assert {(r.channel, r.temperature, r.max_tokens) for r in worker.requests} == {("worker-optimisation", 0.7, 5)}


@pytest.mark.parametrize("bad", [{"temperature": "hot"}, {"max_tokens": 0}, {"judge_temperature": True},
                                 {"judge_max_tokens": 2.5}])
def test_a_bad_decoding_is_refused_before_the_session_writes_anything(bad, word_sorting, tmp_path):
    with pytest.raises(HeldoutError, match=f"decoding {next(iter(bad))} must be"):
        Session(word_sorting, budget=5, run_dir=tmp_path / "run", decoding=Decoding(**bad),
                models=SessionModels(worker=FunctionWorker(sort_the_list)))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("stated", [{"temperature": 0.7}, {"max_tokens": 5, "prompt_format": "zero_shot"},
                                    {"judge_temperature": 0.3, "judge_max_tokens": 9}])
def test_a_decoding_setting_among_the_task_options_is_refused_naming_the_decoding_parameter(stated, word_sorting,
                                                                                            tmp_path):
    """Not split again silently: the session's decoding has one typed place."""
    with pytest.raises(HeldoutError, match=r"decoding settings, not task options: pass them as decoding=Decoding\("):
        Session(word_sorting, budget=5, run_dir=tmp_path / "run", options=stated,
                models=SessionModels(worker=FunctionWorker(sort_the_list)))
    assert not (tmp_path / "run").exists()
    with pytest.raises(HeldoutError, match="decoding must be a Decoding"):
        Session(word_sorting, budget=5, run_dir=tmp_path / "run", decoding={"temperature": 0.7},
                models=SessionModels(worker=FunctionWorker(sort_the_list)))


def test_a_sessions_decoding_reaches_its_models_and_its_task_options_its_tasks_context(word_sorting, tmp_path):
    worker = RecordingModel()
    session = Session(word_sorting, budget=4, run_dir=tmp_path / "run", decoding=Decoding(temperature=0.7, max_tokens=5),
                      options={"prompt_format": "zero_shot"}, models=SessionModels(worker=worker))
    assert session.scorer.decoding == session.deploy_scorer.decoding == Decoding(temperature=0.7, max_tokens=5)
    assert session.scorer.options == session.deploy_scorer.options == {"prompt_format": "zero_shot"}

    def one_evaluation(view, seed):
        view.evaluate(view.seed_candidate, "train", [ex["id"] for ex in view.train[:2]])
        return view.seed_candidate
    assert session.run(one_evaluation).status == "ok"
    assert {(r.temperature, r.max_tokens) for r in worker.requests} == {(0.7, 5)}


def test_heldouts_own_models_meet_the_chat_client_protocol_and_a_task_worker_does_not():
    assert isinstance(ModelClient("m", base_url="http://127.0.0.1:9/v1"), ChatClient)
    assert isinstance(FunctionWorker(sort_the_list), ChatClient)
    assert not isinstance(TaskWorkerOnly(), ChatClient)
