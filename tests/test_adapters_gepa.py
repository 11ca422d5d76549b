"""GEPA 0.1.4 itself, driven through a heldout view: the ledger counts what GEPA believes it
spent, the budget is never overshot (GEPA's own stop check would), GEPA ends cleanly on the
refusal with its best so far, labels reach the reflection model only where the policy allows,
and the run isolated (the adapter and GEPA in the sandboxed child) leaves the same record."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("gepa", reason="the [gepa] extra is not installed (CI installs it)")

import heldout  # noqa: E402
from heldout.adapters.gepa import (BudgetExhausted, SplitLoader, ViewGEPAAdapter,  # noqa: E402
                                   optimize as run_gepa, unprefixed)
from heldout.contracts import HeldoutError, InfrastructureFailure  # noqa: E402
from heldout.evaluators.isolated import run_isolated  # noqa: E402
from heldout.evaluators.ledger import LEDGER_FILE, verify_ledger  # noqa: E402
from heldout.evaluators.session import Budget, Session  # noqa: E402
from heldout.evaluators.scoring import SessionModels
from heldout.models import ModelClient  # noqa: E402
from heldout.models.testserver import TestServer  # noqa: E402
from heldout.optimizers import resolve_optimizer  # noqa: E402

BUDGET = 120  # the seed's val pass (50) + a few minibatch rounds + at most one more val pass


def ledger(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / LEDGER_FILE).read_text().splitlines()]


def gepa_event(entries: list[dict]) -> dict:
    events = [e["data"]["data"] for e in entries if e["kind"] == "optimizer_event" and e["data"]["kind"] == "gepa_run"]
    assert len(events) == 1
    return events[0]


@pytest.fixture
def readable_dir():
    """World-readable, so the isolated child's throw-away uid can use run dirs inside it."""
    path = Path(tempfile.mkdtemp(prefix="heldout-test-gepa-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def word_sorting(data_dir):
    return heldout.load_task("bbh/word_sorting", data_dir=data_dir)  # default profile: 50/50/150


def session(task, server: TestServer, run_dir: Path, budget: int = BUDGET, **kw) -> Session:
    run_dir.mkdir(mode=0o755)
    model = ModelClient("test", base_url=server.base_url, api_key="k")
    return Session(task, budget=Budget(budget, wall_seconds=600), seed=0, models=SessionModels(worker=model, architect=model),
                   run_dir=run_dir, method="gepa", **kw)


def test_gepa_is_a_named_method():
    assert resolve_optimizer("gepa").__module__ == "heldout.optimizers.gepa"


def test_gepa_run_is_counted_by_the_ledger_and_ends_cleanly_at_the_budget(word_sorting, readable_dir):
    with TestServer() as srv:
        record = session(word_sorting, srv, readable_dir / "run").run(resolve_optimizer("gepa"))
    assert record.status == "ok", record.error
    entries = ledger(readable_dir / "run")
    event = gepa_event(entries)
    charged = sum(e["data"]["cost"] for e in entries if e["kind"] == "evaluation")
    # what GEPA believes it spent == what the adapter reported == what the ledger charged
    assert event["gepa_total_metric_calls"] == event["adapter_metric_calls"] == charged == record.usage["metric_calls"]
    assert charged <= BUDGET
    # GEPA's stop check alone would have started the next val pass; the view refused it (nothing
    # ran) and GEPA returned its best so far
    assert event["outcome"] == "refused" and event["refusals"] == 1
    assert any(e["kind"] == "budget_refused" for e in entries)
    assert event["candidates"] >= 1 and record.final_candidate_id is not None
    evaluated = {e["data"]["candidate_id"] for e in entries if e["kind"] == "evaluation"}
    assert record.final_candidate_id in evaluated
    # the held-out split was scored once, by the harness, after GEPA returned
    test_rows = [e for e in entries if e["kind"] == "test_scoring"]
    assert len(test_rows) == len({e["data"]["example_id"] for e in test_rows}) == 150
    final_at = next(i for i, e in enumerate(entries) if e["kind"] == "final_candidate")
    assert all(entries.index(e) > final_at for e in test_rows)
    assert all(e["data"]["split"] in ("train", "val") for e in entries if e["kind"] == "evaluation")
    # the reflection model is the metered architect
    assert record.usage["endpoint_calls"].get("architect", 0) >= 1
    assert verify_ledger(readable_dir / "run").ok


def test_under_repeated_scoring_the_ledger_exceeds_gepas_count_by_exactly_its_uncounted_val_calls(
        word_sorting, readable_dir):
    # GEPA 0.1.4 counts a validation pass one call per example whatever the adapter reports; under
    # repeated:2 the view charges two. The event names the difference, and nothing else differs.
    with TestServer() as srv:
        record = session(word_sorting, srv, readable_dir / "run", budget=2 * BUDGET,
                         verifier="repeated:2").run(resolve_optimizer("gepa"))
    assert record.status == "ok", record.error
    entries = ledger(readable_dir / "run")
    event = gepa_event(entries)
    charged = sum(e["data"]["cost"] for e in entries if e["kind"] == "evaluation")
    val_examples = sum(1 for e in entries if e["kind"] == "evaluation" and e["data"]["split"] == "val")
    assert charged == event["adapter_metric_calls"] == record.usage["metric_calls"] <= 2 * BUDGET
    assert event["val_calls_gepa_did_not_count"] == val_examples > 0  # (K - 1) = 1 per val example
    assert event["gepa_total_metric_calls"] + event["val_calls_gepa_did_not_count"] == charged


def test_gepa_isolated_leaves_the_same_record_as_in_process(word_sorting, readable_dir):
    budget = 106  # gepa's minimum: the seed's val pass, one minibatch round, one child's val pass
    with TestServer() as srv:
        inproc = session(word_sorting, srv, readable_dir / "inproc", budget).run(run_gepa)
        isolated = run_isolated(session(word_sorting, srv, readable_dir / "iso", budget),
                                [sys.executable, "-m", "heldout.adapters.gepa"])
    assert inproc.status == isolated.status == "ok", isolated.error
    assert isolated.final_candidate_id == inproc.final_candidate_id
    assert isolated.test_score == inproc.test_score
    assert isolated.usage["metric_calls"] == inproc.usage["metric_calls"]

    def calls(run_dir):
        return [(e["data"]["candidate_id"], e["data"]["split"], e["data"]["example_id"])
                for e in ledger(run_dir) if e["kind"] == "evaluation"]
    assert calls(readable_dir / "iso") == calls(readable_dir / "inproc")
    assert gepa_event(ledger(readable_dir / "iso")) == gepa_event(ledger(readable_dir / "inproc"))


def test_reflective_dataset_carries_only_what_the_policy_shows(word_sorting, readable_dir):
    with TestServer() as srv:
        view = session(word_sorting, srv, readable_dir / "run").view
        adapter = ViewGEPAAdapter(view)
        train, val = SplitLoader("train", view.train), SplitLoader("val", view.val)
        seed = view.seed_candidate
        on_train = adapter.evaluate(train.fetch(train.all_ids()[:3]), seed, capture_traces=True)
        on_val = adapter.evaluate(val.fetch(val.all_ids()[:3]), seed, capture_traces=True)
    train_records = adapter.make_reflective_dataset(seed, on_train, ["instruction"])["instruction"]
    val_records = adapter.make_reflective_dataset(seed, on_val, ["instruction"])["instruction"]
    targets = {ex["id"]: ex["target"] for ex in view.train}
    for record, data_id in zip(train_records, train.all_ids()[:3]):
        assert set(record) == {"Inputs", "Generated Outputs", "Feedback"}
        assert f"Expected answer: {targets[unprefixed(data_id)[1]]}" in record["Feedback"]
        # the worker's text as a model would read it, never the harness's dict of readings
        shown = record["Generated Outputs"]
        assert shown.strip() and not shown.startswith("{") and "extracted_" not in shown and "'why'" not in shown
    # the standard policy shows val scores only: no output, no feedback, no target
    for record in val_records:
        assert set(record) == {"Inputs", "Feedback"}
        assert record["Feedback"].startswith("Score: ") and "\n" not in record["Feedback"]
    assert len(on_val.outputs) == len(on_val.scores) == len(on_val.trajectories) == 3
    assert all(set(out) == {"id", "score"} for out in on_val.outputs)


def test_ids_are_split_prefixed_so_train_and_val_never_share_an_id(word_sorting, readable_dir):
    with TestServer() as srv:
        view = session(word_sorting, srv, readable_dir / "run").view
        train, val = SplitLoader("train", view.train), SplitLoader("val", view.val)
        assert all(i.startswith("train:") for i in train.all_ids())
        assert not set(train.all_ids()) & set(val.all_ids())
        adapter = ViewGEPAAdapter(view)
        adapter.evaluate(val.fetch(val.all_ids()[:2]), view.seed_candidate)
        with pytest.raises(HeldoutError, match="mixes splits"):
            adapter.evaluate(train.fetch(train.all_ids()[:1]) + val.fetch(val.all_ids()[:1]), view.seed_candidate)
        with pytest.raises(HeldoutError, match="split-prefixed"):
            adapter.evaluate([{"id": "test:0", "input": {}}], view.seed_candidate)
    evaluated = [e["data"] for e in ledger(readable_dir / "run") if e["kind"] == "evaluation"]
    assert [(d["split"], d["example_id"]) for d in evaluated] == [unprefixed(i) for i in val.all_ids()[:2]]


def test_a_failing_worker_stops_gepa_and_scores_nothing(word_sorting, readable_dir):
    # an endpoint that answers 500 to everything is the infrastructure's failure, never a 0 for the
    # candidate: the adapter lets the session's InfrastructureFailure through and the ledger holds
    # no evaluation of the batch
    with TestServer(error_rate=1.0) as srv:
        run_dir = readable_dir / "run"
        run_dir.mkdir(mode=0o755)
        model = ModelClient("test", base_url=srv.base_url, api_key="k", max_retries=0)
        session = Session(word_sorting, budget=Budget(10), models=SessionModels(worker=model), run_dir=run_dir)
        train = SplitLoader("train", session.view.train)
        with pytest.raises(InfrastructureFailure, match="4 of 4 example"):
            ViewGEPAAdapter(session.view).evaluate(train.fetch(train.all_ids()[:4]), session.view.seed_candidate,
                                                   capture_traces=True)
    assert not list(session.ledger.entries("evaluation"))
    assert [e["data"]["refunded"] for e in session.ledger.entries("infrastructure_failure")] == [4]


def test_an_evaluation_past_the_budget_is_refused_and_stops_gepa(word_sorting, readable_dir):
    with TestServer() as srv:
        view = session(word_sorting, srv, readable_dir / "run", budget=5).view
        adapter = ViewGEPAAdapter(view)
        train = SplitLoader("train", view.train)
        adapter.evaluate(train.fetch(train.all_ids()[:3]), view.seed_candidate)
        assert not adapter.should_stop(None)
        with pytest.raises(BudgetExhausted):
            adapter.evaluate(train.fetch(train.all_ids()[3:6]), view.seed_candidate)
        assert adapter.should_stop(None) and view.remaining == 2 and adapter.metric_calls == 3
