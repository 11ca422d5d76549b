"""DSPy 3.4.1 itself, driven through a heldout view: dspy.Evaluate, MIPROv2 and dspy.GEPA run their
programs on heldout's metered worker (each DSPy worker-LM call is one view evaluation), so the
ledger counts what DSPy believes it spent, the budget is never overshot, the metrics see only what
the policy shows, and an isolated run leaves the same record as an in-process one."""

from __future__ import annotations

import gc
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("dspy", reason="the [dspy] extra is not installed (CI installs it)")
pytest.importorskip("optuna", reason="MIPROv2 needs optuna (the [dspy] extra installs it)")

import dspy  # noqa: E402

import heldout  # noqa: E402
from heldout.adapters.dspy import (ViewBridge, HeldoutProgram, feedback_metric, heldout_examples,  # noqa: E402
                                   metric, optimize_mipro)
from heldout.contracts import HeldoutError  # noqa: E402
from heldout.evaluators.isolated import run_isolated  # noqa: E402
from heldout.evaluators.ledger import LEDGER_FILE, verify_ledger  # noqa: E402
from heldout.evaluators.session import Budget, Session  # noqa: E402
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient  # noqa: E402
from heldout.models.testserver import TestServer  # noqa: E402
from heldout.optimizers import resolve_optimizer  # noqa: E402


def ledger(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / LEDGER_FILE).read_text().splitlines()]


def evaluations(run_dir: Path) -> list[dict]:
    return [e["data"] for e in ledger(run_dir) if e["kind"] == "evaluation"]


def dspy_event(run_dir: Path) -> dict:
    events = [e["data"]["data"] for e in ledger(run_dir)
              if e["kind"] == "optimizer_event" and e["data"]["kind"] == "dspy_run"]
    assert len(events) == 1
    return events[0]


def assert_test_scored_once(run_dir: Path, n_test: int) -> None:
    entries = ledger(run_dir)
    rows = [e for e in entries if e["kind"] == "test_scoring"]
    assert len(rows) == len({e["data"]["example_id"] for e in rows}) == n_test
    final_at = next(i for i, e in enumerate(entries) if e["kind"] == "final_candidate")
    assert all(entries.index(e) > final_at for e in rows)


@pytest.fixture
def readable_dir():
    path = Path(tempfile.mkdtemp(prefix="heldout-test-dspy-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def word_sorting(data_dir):
    return heldout.load_task("bbh/word_sorting", data_dir=data_dir)  # 50/50/150


def session(task, server: TestServer, run_dir: Path, budget: int, method: str = "dspy") -> Session:
    run_dir.mkdir(mode=0o755)
    model = ModelClient("test", base_url=server.base_url, api_key="k")
    return Session(task, budget=Budget(budget, wall_seconds=600), seed=0, models=SessionModels(worker=model, architect=model),
                   run_dir=run_dir, method=method)


def test_dspy_methods_are_named():
    assert resolve_optimizer("dspy-mipro").__module__ == resolve_optimizer("dspy-gepa").__module__ == \
        "heldout.optimizers.dspy"


def test_dspy_evaluate_runs_on_the_metered_worker_and_counts_one_call_per_example(word_sorting, readable_dir):
    with TestServer() as srv:
        view = session(word_sorting, srv, readable_dir / "run", budget=60).view
        bridge = ViewBridge(view)
        program = HeldoutProgram(view, bridge)
        devset = heldout_examples(view, "val")[:20]
        result = dspy.Evaluate(devset=devset, metric=metric, num_threads=1, display_progress=False)(program)
    rows = evaluations(readable_dir / "run")
    # what DSPy believes it called == what the ledger charged, one per example of the devset
    assert len(program.worker.history) == bridge.worker_calls == len(rows) == 20 == 60 - view.remaining
    assert {r["split"] for r in rows} == {"val"}
    assert result.score == pytest.approx(100 * sum(r["verdict"]["score"] for r in rows) / 20)
    # DSPy never sees a val output or target: the standard policy shows val scores only
    assert all(not hasattr(ex, "answer") for ex in devset)
    assert all(str(pred.answer).startswith("(not shown") for _, pred, _ in result.results)


def test_metrics_see_only_what_the_policy_shows(word_sorting, readable_dir):
    with TestServer() as srv:
        view = session(word_sorting, srv, readable_dir / "run", budget=10).view
        program = HeldoutProgram(view, ViewBridge(view))
        train_ex, val_ex = heldout_examples(view, "train")[0], heldout_examples(view, "val")[0]
        on_train, on_val = program(**train_ex.inputs()), program(**val_ex.inputs())
    assert metric(train_ex, on_train) == on_train.heldout_verdict["score"]
    train_fb = feedback_metric(train_ex, on_train, None, "predict", None)
    val_fb = feedback_metric(val_ex, on_val, None, "predict", None)
    assert f"Expected answer: {train_ex.answer}" in train_fb.feedback
    assert val_fb.feedback == f"Score: {on_val.heldout_verdict['score']:g}"
    assert set(on_val.heldout_verdict) == {"id", "score"}
    with pytest.raises(HeldoutError, match="did not come from a HeldoutProgram"):
        metric(train_ex, dspy.Prediction(answer="x"))
    with pytest.raises(HeldoutError, match="heldout_ref"):
        program(question="not an example of this task")


def test_mipro_run_is_counted_by_the_ledger_within_the_budget(word_sorting, readable_dir):
    budget = 240
    with TestServer() as srv:
        record = session(word_sorting, srv, readable_dir / "run", budget, "dspy-mipro").run(resolve_optimizer("dspy-mipro"))
    assert record.status == "ok", record.error
    run_dir = readable_dir / "run"
    rows, event = evaluations(run_dir), dspy_event(run_dir)
    assert event["outcome"] == "done" and event["refusals"] == 0 and event["trials"] >= 2
    assert event["worker_lm_calls"] == event["bridge_worker_calls"] == len(rows) == record.usage["metric_calls"] <= budget
    # MIPROv2 counts its val evaluations (total_eval_calls); its few-shot bootstrap pass over train
    # runs before them and is not in its count: exactly the train rows, all ahead of the first val row
    splits = [r["split"] for r in rows]
    bootstrap = splits.index("val")
    assert set(splits[:bootstrap]) == {"train"} and set(splits[bootstrap:]) == {"val"}
    assert event["mipro_total_eval_calls"] == len(rows) - bootstrap
    assert event["mipro_total_eval_calls"] <= event["planned_metric_calls"]
    assert record.usage["endpoint_calls"]["architect"] >= 1  # the proposer ran on the metered architect
    assert_test_scored_once(run_dir, 150)
    assert verify_ledger(run_dir).ok


@pytest.mark.parametrize("budget, used", [(40, 17), (7, 0)])
def test_dspy_gepa_validates_on_as_many_val_examples_as_a_small_budget_can_pay_for(budget, used, word_sorting,
                                                                                   readable_dir):
    # 50 val examples: a budget of 40 would go to a partial val pass of the seed; instead GEPA
    # validates on the first 17, so the seed, one minibatch round (2 x 3) and one child fit
    with TestServer() as srv:
        record = session(word_sorting, srv, readable_dir / "run", budget, "dspy-gepa").run(resolve_optimizer("dspy-gepa"))
    rows = evaluations(readable_dir / "run")
    if used == 0:  # below the minimum (the seed and a child on one val example, 2 x 3 on a minibatch):
        # nothing spent, and the cell is not the seed's score under dspy-gepa's name
        assert record.status == "failed" and "BudgetTooSmall" in record.error and "at least 8" in record.error
        assert rows == [] and record.test_score is None
        return
    assert record.status == "ok", record.error
    event = dspy_event(readable_dir / "run")
    assert (event["val_examples"], event["val_examples_used"]) == (50, used)
    seed_val = [r for r in rows if r["split"] == "val" and r["candidate_id"] == rows[0]["candidate_id"]]
    assert len({r["example_id"] for r in seed_val}) == used  # the seed's val pass is whole
    assert record.usage["metric_calls"] <= budget


def test_dspy_gepa_sessions_leave_no_model_client_threads_behind(word_sorting, readable_dir):
    """A study runs cell after cell in one worker process. DSPy keeps its settings (the LM, which
    reaches the session and its clients) in a context variable; the clients must still end with
    their session, else loop threads and keep-alive connections pile up until the endpoint refuses
    every later cell (seen at 150 cells of perf/paper_study.py)."""
    def loop_threads() -> set[threading.Thread]:  # other tests' clients may still be ending theirs
        return {t for t in threading.enumerate() if t.name == "heldout-model-client"}

    before = loop_threads()
    with TestServer() as srv:
        for k in range(2):
            record = session(word_sorting, srv, readable_dir / f"run-{k}", 40, "dspy-gepa").run(
                resolve_optimizer("dspy-gepa"))
            assert record.status == "ok", record.error
        gc.collect()
        deadline = time.monotonic() + 10
        while loop_threads() - before and time.monotonic() < deadline:  # finalizers stop the loops
            time.sleep(0.01)
    assert not loop_threads() - before  # none of this test's clients' loops is left


def test_dspy_gepa_counts_refused_rollouts_as_the_only_difference(word_sorting, readable_dir):
    budget = 120  # the seed's val pass, one accepted child and its val pass, then a pass that does not fit
    with TestServer() as srv:
        record = session(word_sorting, srv, readable_dir / "run", budget, "dspy-gepa").run(resolve_optimizer("dspy-gepa"))
    assert record.status == "ok", record.error
    run_dir = readable_dir / "run"
    rows, event = evaluations(run_dir), dspy_event(run_dir)
    refused = [e for e in ledger(run_dir) if e["kind"] == "budget_refused"]
    assert len(rows) == record.usage["metric_calls"] == event["worker_lm_calls"] <= budget
    # dspy.GEPA scores a refused rollout as a failure and counts it; the view charged nothing for it
    assert event["gepa_total_metric_calls"] == len(rows) + event["refusals"]
    assert event["refusals"] == len(refused) >= 1 and event["outcome"] == "refused"
    assert_test_scored_once(run_dir, 150)


def test_mipro_isolated_leaves_the_same_record_as_in_process(word_sorting, readable_dir):
    budget = 240
    with TestServer() as srv:
        inproc = session(word_sorting, srv, readable_dir / "inproc", budget).run(optimize_mipro)
        isolated = run_isolated(session(word_sorting, srv, readable_dir / "iso", budget),
                                [sys.executable, "-m", "heldout.adapters.dspy", "mipro"])
    assert inproc.status == isolated.status == "ok", isolated.error
    assert isolated.final_candidate_id == inproc.final_candidate_id
    assert isolated.test_score == inproc.test_score
    assert isolated.usage["metric_calls"] == inproc.usage["metric_calls"]

    def calls(run_dir):
        return [(r["candidate_id"], r["split"], r["example_id"]) for r in evaluations(run_dir)]
    assert calls(readable_dir / "iso") == calls(readable_dir / "inproc")
    assert dspy_event(readable_dir / "iso") == dspy_event(readable_dir / "inproc")


def candidates(run_dir: Path) -> dict[str, dict]:
    return {e["data"]["candidate_id"]: e["data"]["components"] for e in ledger(run_dir) if e["kind"] == "candidate"}


def demos_of(text: str) -> list[str]:
    """The answers of the demos a candidate carries (after its "Examples:" block)."""
    _, found, shown = text.partition("\n\nExamples:\n\n")
    return [line[len("answer: "):] for line in shown.splitlines() if line.startswith("answer: ")] if found else []


def test_mipro_by_default_proposes_bootstrapped_and_labeled_demos_as_dspy_does(word_sorting, readable_dir):
    import inspect
    from heldout.models.server import ChatServer
    from heldout.models.testserver import RecordingBackend
    backend = RecordingBackend()
    with ChatServer(backend) as srv:  # seed 0: MIPROv2's best program on val is one with demos
        run_dir = readable_dir / "run"
        run_dir.mkdir(mode=0o755)
        model = ModelClient("test", base_url=srv.base_url, api_key="k")
        record = Session(word_sorting, budget=Budget(240, wall_seconds=600), seed=0, models=SessionModels(worker=model, architect=model),
                         run_dir=run_dir, method="dspy-mipro").run(resolve_optimizer("dspy-mipro"))
    assert record.status == "ok", record.error
    event = dspy_event(run_dir)
    # what MIPROv2 received is DSPy's own defaults, read from DSPy's signatures (not a copy of them)
    init, compile_ = (inspect.signature(f).parameters for f in (dspy.MIPROv2.__init__, dspy.MIPROv2.compile))
    assert event["passed_to_dspy"] == {
        "max_bootstrapped_demos": init["max_bootstrapped_demos"].default,
        "max_labeled_demos": init["max_labeled_demos"].default,
        **{k: compile_[k].default for k in ("program_aware_proposer", "data_aware_proposer", "tip_aware_proposer",
                                            "fewshot_aware_proposer")}}
    assert event["settings"]["zero_shot"] is False
    # the ledger shows demos proposed and judged on val: labeled ones (train targets) and
    # bootstrapped ones (the worker's own successful outputs on train)
    train_targets = {str(ex.target) for ex in word_sorting.splits["train"]}
    evaluated = {r["candidate_id"] for r in evaluations(run_dir) if r["split"] == "val"}
    shown = [demos_of(c["instruction"]) for cid, c in candidates(run_dir).items() if cid in evaluated]
    answers = [a for demos in shown for a in demos]
    assert any(a in train_targets for a in answers) and any("So the answer is" in a for a in answers)
    # the final candidate carries its demos, and it is what the harness scored on test
    final = [e["data"] for e in ledger(run_dir) if e["kind"] == "final_candidate"][0]
    assert demos_of(record.final_candidate["instruction"]) and event["final_has_demos"] is True
    assert final["components"] == record.final_candidate
    # the program-aware proposer read the program as a DSPy user writes it, not heldout's wrapper
    sent = "\n".join(str(m.get("content")) for call in backend.calls for m in call.messages)
    assert 'self.predict = dspy.Predict("question -> answer")' in sent and "class HeldoutProgram" not in sent
    assert record.extra["selection"] == {"split": "val", "how": "MIPROv2 keeps the trial program with the best "
                                                                "full evaluation on this split"}


def test_mipro_zero_shot_is_a_named_setting_with_no_demos_and_no_aware_proposers(word_sorting, readable_dir):
    with TestServer() as srv:
        record = session(word_sorting, srv, readable_dir / "run", 240, "dspy-mipro").run(
            resolve_optimizer("dspy-mipro?zero_shot=true"))
    assert record.status == "ok", record.error
    event = dspy_event(readable_dir / "run")
    assert event["passed_to_dspy"]["max_bootstrapped_demos"] == event["passed_to_dspy"]["max_labeled_demos"] == 0
    assert not event["passed_to_dspy"]["program_aware_proposer"] and not event["passed_to_dspy"]["data_aware_proposer"]
    # MIPROv2 still bootstraps on train, for its proposer's context only
    assert 0 < event["bootstrap_metric_calls"] <= 50 and not event["final_has_demos"]
    assert not any(demos_of(c["instruction"]) for c in candidates(readable_dir / "run").values())
