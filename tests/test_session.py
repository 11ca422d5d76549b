"""Protected sessions: budget, visibility, ledger, run records, resume."""

from __future__ import annotations

import gc
import json
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import heldout
from heldout.evaluators.ledger import LEDGER_FILE, Ledger, LedgerError, verify_ledger
from heldout.evaluators.records import RunRecord
from heldout.evaluators.same_experiment import ExperimentMismatch
from heldout.contracts import BudgetExceeded, InfrastructureFailure, MalformedCandidate, VisibilityError
from heldout.evaluators.records import RECORD_FILE
from heldout.evaluators.session import Budget, Outcome, Session
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient
from heldout.models.testserver import TestServer


@pytest.fixture(scope="module")
def server():
    with TestServer(latency=0.0, seed=0) as srv:
        yield srv


@pytest.fixture
def bbh_task(data_dir):
    return heldout.load_task("bbh/word_sorting", profile="sepo", data_dir=data_dir)


def worker_for(server) -> ModelClient:
    return ModelClient("test-model", base_url=server.base_url, api_key="k", concurrency=8)


def test_prompt_task_runs_end_to_end_and_test_is_scored_once_outside_the_budget(server, bbh_task, tmp_path):
    session = Session(bbh_task, budget=60, seed=0, models=SessionModels(worker=worker_for(server)), run_dir=tmp_path)

    def optimizer(view, seed):
        view.evaluate(view.seed_candidate, "train", [ex["id"] for ex in view.train[:20]])
        better = {"instruction": view.seed_candidate["instruction"] + " Sort words alphabetically."}
        view.evaluate(better, "train", [ex["id"] for ex in view.train[:20]])
        assert view.remaining == 20
        return better

    calls_before = server.stats.calls
    record = session.run(optimizer)
    assert record.status == "ok" and record.usage["metric_calls"] == 40
    assert len(record.test_verdicts) == 200
    assert server.stats.calls - calls_before == 40 + 200  # optimisation + deployment, no more
    assert record.usage["tokens"]["worker-deployment"]["prompt"] > 0
    assert verify_ledger(tmp_path).ok
    loaded = RunRecord.load(tmp_path)
    assert loaded.test_score == record.test_score and loaded.ledger_head == record.ledger_head
    assert [p["metric_calls"] for p in loaded.trajectory] == sorted(p["metric_calls"] for p in loaded.trajectory)


def test_view_refuses_test_and_hides_val_targets(server, bbh_task, tmp_path):
    session = Session(bbh_task, budget=10, models=SessionModels(worker=worker_for(server)), run_dir=tmp_path)
    view = session.view
    with pytest.raises(VisibilityError, match="test"):
        view.evaluate(view.seed_candidate, "test")
    assert all(set(ex) == {"id", "input"} for ex in view.val)
    train = view.evaluate(view.seed_candidate, "train", [view.train[0]["id"]])[0]
    assert {"score", "feedback", "target"} <= set(train)


def test_budget_is_refused_before_anything_runs(server, bbh_task, tmp_path):
    session = Session(bbh_task, budget=5, models=SessionModels(worker=worker_for(server)), run_dir=tmp_path)
    ids = [ex["id"] for ex in session.view.train[:6]]
    before = server.stats.calls
    with pytest.raises(BudgetExceeded, match="5 of 5 metric calls left"):
        session.view.evaluate(session.view.seed_candidate, "train", ids)
    assert server.stats.calls == before and session.view.remaining == 5
    assert any(e["kind"] == "budget_refused" for e in session.ledger.entries())


def test_cache_hits_count_as_metric_calls_but_cost_no_endpoint_call(server, bbh_task, tmp_path):
    session = Session(bbh_task, budget=10, models=SessionModels(worker=worker_for(server)), run_dir=tmp_path)
    ids = [ex["id"] for ex in session.view.train[:3]]
    first = session.view.evaluate(session.view.seed_candidate, "train", ids)
    before = server.stats.calls
    again = session.view.evaluate(session.view.seed_candidate, "train", ids)
    assert server.stats.calls == before and session.view.remaining == 4
    assert [r["score"] for r in first] == [r["score"] for r in again]
    assert session.service.usage.cache_hits == 3


@settings(max_examples=10, deadline=None)
@given(batches=st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=12),
       budget=st.integers(min_value=0, max_value=30))
def test_budget_never_overshoots(batches, budget, tmp_path_factory):
    from concurrent.futures import ThreadPoolExecutor

    task = heldout.load_task("lockpicking/six", profile="paper")
    session = Session(task, budget=budget, run_dir=tmp_path_factory.mktemp("b"))
    view = session.view
    ids = [ex["id"] for ex in view.train]

    def one(i_n):
        i, n = i_n
        cand = {"scorer.sql": f"LENGTH(PROGRAM) + {i}"}
        try:
            return len(view.evaluate(cand, "train", ids[:n]))
        except BudgetExceeded:
            return 0

    with ThreadPoolExecutor(max_workers=4) as pool:
        done = sum(pool.map(one, enumerate(batches)))
    assert done == session.service.usage.metric_calls <= budget
    assert sum(1 for _ in session.ledger.entries("evaluation")) == done


def _reachable(root, limit=200_000):
    """Every object reachable from ``root`` through instance state, containers and closures
    (not through modules or classes: in-process optimizers share the interpreter anyway)."""
    seen, stack, out = set(), [root], []
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (types.ModuleType, type)):
            continue
        seen.add(id(obj))
        out.append(obj)
        stack.extend(gc.get_referents(obj))
    return out


def test_no_test_target_is_reachable_from_the_view(server, bbh_task, tmp_path):
    session = Session(bbh_task, budget=10, models=SessionModels(worker=worker_for(server)), run_dir=tmp_path)
    test_ids = {ex.id for ex in bbh_task.split("test")}
    test_examples = [ex for ex in bbh_task.split("test")]
    reachable = _reachable(session.view)
    assert not any(any(obj is ex for ex in test_examples) for obj in reachable)
    exposed_ids = {ex["id"] for ex in session.view.train} | {ex["id"] for ex in session.view.val}
    assert not (exposed_ids & test_ids)


def test_crashing_optimizer_gives_a_failed_record_and_a_verifying_ledger(tmp_path):
    task = heldout.load_task("lockpicking/six", profile="paper")
    session = Session(task, budget=100, run_dir=tmp_path)

    def optimizer(view, seed):
        view.evaluate(view.seed_candidate, "train")
        raise RuntimeError("optimizer bug")

    record = session.run(optimizer)
    assert record.status == "failed" and "optimizer bug" in record.error
    assert record.test_verdicts == [] and verify_ledger(tmp_path).ok
    # the ledger says where it raised, once, just before the session's end
    entries = list(Ledger.open(tmp_path).entries())
    assert [e["kind"] for e in entries][-2:] == ["optimizer_failed", "session_end"]
    failed = entries[-2]["data"]
    assert "RuntimeError: optimizer bug" in failed["error"] and "in optimizer" in failed["traceback"]


def test_resume_reuses_recorded_results_without_double_counting(tmp_path):
    task = heldout.load_task("lockpicking/six", profile="paper")
    ids = [ex.id for ex in task.split("train")]
    cand = {"scorer.sql": "LENGTH(PROGRAM)"}
    first = Session(task, budget=100, run_dir=tmp_path)
    first.view.evaluate(cand, "train", ids[:10])
    first.ledger.close()  # as if the process had died here
    resumed = Session(task, budget=100, run_dir=tmp_path)
    # spent budget stays spent; the optimizer, restarted, sees the budget of its original start
    assert resumed.service.remaining == 90 and resumed.view.remaining == 100
    again = resumed.view.evaluate(cand, "train", ids[:15])  # 10 replayed + 5 new
    assert resumed.view.remaining == 85 and len(again) == 15
    assert resumed.service.usage.replayed == 10
    assert verify_ledger(tmp_path).ok


def test_a_run_dir_holding_a_finished_session_is_refused_and_left_as_it_was(tmp_path):
    task = heldout.load_task("lockpicking/six", profile="generalise")
    record = Session(task, budget=10, run_dir=tmp_path, verifier="tests:count-only").run(lambda view, seed: view.seed_candidate)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ExperimentMismatch, match="holds a finished session"):
        Session(task, budget=10, run_dir=tmp_path, verifier="tests:count-only")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    # the end: what held-out scoring left for it, then session_end naming the record, in that order
    kinds = [json.loads(line)["kind"] for line in (tmp_path / LEDGER_FILE).read_text().splitlines()]
    own = len(task.split("val"))
    assert kinds[-own - 2:] == ["val_scoring_own_verifier"] * own + ["test_metrics", "session_end"]
    assert record.extra["val_score_own_verifier"] is not None and "exhaustive_accuracy" in record.extra["test_metrics"]


@pytest.mark.parametrize("given, refusal", [
    ({"options": {"prompt_format": "no-such-format"}}, "has no prompt format 'no-such-format'"),
    ({"options": {"temperature": 0.5}}, "decoding settings, not task options"),
    ({"verifier": "no-such-verifier"}, "no-such-verifier"),
])
def test_a_session_refused_for_what_it_was_given_writes_nothing(given, refusal, bbh_task, tmp_path):
    """Options and verifier are checked against the task before the ledger opens."""
    with pytest.raises(heldout.HeldoutError, match=refusal):
        Session(bbh_task, budget=5, run_dir=tmp_path / "run", **given)
    assert not (tmp_path / "run").exists()


def test_an_outcomes_final_is_a_plain_checked_candidate():
    class Sneaky(dict):  # could hash as one candidate and run as another
        pass

    given = {"instruction": "Sort."}
    final = Outcome(given).final
    assert final == given and final is not given  # what is scored and recorded: the checked copy
    for malformed in ({}, {"instruction": 1}, ["instruction"], Sneaky(instruction="Sort.")):
        with pytest.raises(MalformedCandidate):
            Outcome(malformed)
    assert (Outcome({"a": "b"}).status, Outcome(error="crashed").status) == ("ok", "failed")


def test_an_incomplete_outcome_ends_the_session_without_a_record_and_it_resumes(tmp_path):
    """The one end of every session: the infrastructure's failure (here an isolated optimizer's
    sandbox that could not be set up) is no score and no record, and ``--resume`` runs it again."""
    task = heldout.load_task("lockpicking/six", profile="generalise")
    session = Session(task, budget=10, run_dir=tmp_path, verifier="tests:count-only")
    session.view.evaluate(session.view.seed_candidate, "train", [session.view.train[0]["id"]])
    with pytest.raises(InfrastructureFailure, match=r"incomplete \(optimisation\): the sandbox could not be set up"):
        session.finish(Outcome(incomplete="the sandbox could not be set up"))
    last = json.loads(_ledger_lines(tmp_path)[-1])
    assert (last["kind"], last["data"]["phase"]) == ("session_incomplete", "optimisation")
    assert not (tmp_path / RECORD_FILE).exists() and verify_ledger(tmp_path).ok
    resumed = Session(task, budget=10, run_dir=tmp_path, verifier="tests:count-only")
    assert resumed.resumed and resumed.run(lambda view, seed: view.seed_candidate).status == "ok"


def test_a_task_gets_its_held_back_split_back_only_with_the_sizes_it_kept():
    task = heldout.load_task("lockpicking/six", profile="generalise")
    held = task.without("test")
    assert held.restored(task) is task and task.restored(held) is task  # nothing held back: itself
    restored = held.restored(("lockpicking/six", "generalise", None, False))  # reloaded by name, verified
    assert [ex.id for ex in restored.split("test")] == [ex.id for ex in task.split("test")]
    with pytest.raises(heldout.DataError, match="loads with split sizes"):  # 50 test examples, not 300
        held.restored(heldout.load_task("lockpicking/six", profile="paper"))


def _ledger_lines(run_dir: Path) -> list[str]:
    return (run_dir / LEDGER_FILE).read_text().splitlines(keepends=True)


@pytest.mark.parametrize("tamper", ["edit", "drop", "insert", "reorder", "drop_tail"])
def test_ledger_verify_detects_tampering(tamper, tmp_path):
    ledger = Ledger.open(tmp_path)
    for i in range(5):
        ledger.append_entry("evaluation", {"i": i, "score": 0.5})
    ledger.close()
    lines = _ledger_lines(tmp_path)
    if tamper == "edit":
        lines[2] = lines[2].replace('"score": 0.5', '"score": 1.0')
    elif tamper == "drop":
        del lines[2]
    elif tamper == "insert":
        lines.insert(2, lines[1])
    elif tamper == "reorder":
        lines[1], lines[2] = lines[2], lines[1]
    else:
        lines = lines[:-1]
    (tmp_path / LEDGER_FILE).write_text("".join(lines))
    report = verify_ledger(tmp_path)
    assert not report.ok and report.problems
    with pytest.raises(LedgerError, match="does not verify"):
        Ledger.open(tmp_path)


def test_torn_last_line_is_repaired_on_resume(tmp_path):
    ledger = Ledger.open(tmp_path)
    ledger.append_entry("evaluation", {"i": 0})
    ledger.close()
    with open(tmp_path / LEDGER_FILE, "ab") as fh:
        fh.write(b'{"seq": 1, "prev": "abc')  # killed mid-write
    reopened = Ledger.open(tmp_path)
    assert [e["kind"] for e in reopened.entries()] == ["evaluation", "torn_tail_repaired"]
    reopened.close()
    assert verify_ledger(tmp_path).ok


def test_cli_ledger_verify(warm_cli, tmp_path):
    ledger = Ledger.open(tmp_path)
    ledger.append_entry("evaluation", {"i": 0})
    ledger.close()
    ok = warm_cli.run("ledger", "verify", str(tmp_path), cwd=tmp_path)
    assert ok.returncode == 0 and "chain intact" in ok.stdout
    text = (tmp_path / LEDGER_FILE).read_text().replace('"i": 0', '"i": 1')
    (tmp_path / LEDGER_FILE).write_text(text)
    bad = warm_cli.run("ledger", "verify", str(tmp_path), cwd=tmp_path)
    assert bad.returncode == 1 and "edited" in bad.stdout


def test_a_recorded_run_replays_exactly_with_zero_endpoint_calls(server, bbh_task, tmp_path):
    from heldout.models import Recorder, Replay
    from heldout.optimizers import resolve_optimizer

    recording = tmp_path / "model_calls.jsonl"
    recorder = Recorder(recording)
    live = Session(bbh_task, budget=40, seed=1, run_dir=tmp_path / "live", method="reflective",
                   models=SessionModels(worker=ModelClient("test-model", base_url=server.base_url, api_key="k", recorder=recorder), architect=ModelClient("test-architect", base_url=server.base_url, api_key="k",
                                         recorder=recorder)))
    original = live.run(resolve_optimizer("reflective"))
    recorder.close()
    calls_before = server.stats.calls
    replay = Replay(recording)
    again = Session(bbh_task, budget=40, seed=1, run_dir=tmp_path / "replayed", method="reflective",
                    models=SessionModels(worker=ModelClient("test-model", replay=replay), architect=ModelClient("test-architect", replay=replay)))
    replayed = again.run(resolve_optimizer("reflective"))
    assert server.stats.calls == calls_before  # zero endpoint calls
    assert replayed.final_candidate == original.final_candidate
    def scored(record):  # everything but timing
        return [{k: v for k, v in verdict.items() if k != "usage"} for verdict in record.test_verdicts]

    assert scored(replayed) == scored(original) and replayed.trajectory == original.trajectory
    assert original.usage["tokens"]["architect"]["prompt"] > 0


def test_reflective_optimizer_uses_the_metered_architect_within_budget(server, bbh_task, tmp_path):
    from heldout.optimizers import resolve_optimizer

    session = Session(bbh_task, budget=Budget(48, architect_tokens=100_000), seed=0, run_dir=tmp_path,
                      models=SessionModels(worker=worker_for(server), architect=ModelClient("test-architect", base_url=server.base_url, api_key="k")))
    record = session.run(resolve_optimizer("reflective"))
    assert record.status == "ok" and record.usage["metric_calls"] <= 48
    architect = record.usage["tokens"]["architect"]
    assert architect["prompt"] > 0 and record.usage["endpoint_calls"]["architect"] >= 1
    assert len(record.lineage) >= 2  # it proposed at least one rewrite
