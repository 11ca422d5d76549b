"""When a session records an evaluation: each fresh verdict joins the ledger's batch as soon as it
and every one asked before it are scored (while later answers are still in flight), in the order
asked whatever order the answers come in, and never while the session waits interruptibly for an
answer (a stop raised there must not land in a ledger write). Against the real loopback server.
And its run record, encoded once: the sealed content digested is what a reader digests."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import heldout
from heldout.contracts import canonical_json
from heldout.evaluators.ledger import verify_ledger
from heldout.evaluators.records import RunRecord
from heldout.evaluators.scoring import SessionModels
from heldout.evaluators.session import Session
from heldout.models import ModelClient
from heldout.models.testserver import TestServer

# the order the answers are handed over in: each pair swapped, so the second of a pair arrives first
HANDED_OVER = [1, 0, 3, 2, 5, 4, 7, 6, 8, 9]


class ReorderingWorker:
    """A real client's answers to a batch, handed over in :data:`HANDED_OVER` order (as a
    ``complete_each`` does when answers arrive out of order); before each hand-over it notes how
    many entries the session's ledger holds (``seen``)."""

    def __init__(self, client: ModelClient) -> None:
        self.client, self.model = client, client.model
        self.session: Session | None = None
        self.seen: list[int] = []

    def complete_many(self, requests, *, return_exceptions=False):
        return self.client.complete_many(requests, return_exceptions=return_exceptions)

    def complete_each(self, requests):
        answers = self.client.complete_many(requests, return_exceptions=True)
        order = HANDED_OVER if len(requests) == len(HANDED_OVER) else range(len(requests))
        for i in order:
            self.seen.append(len(self.session.ledger))
            yield i, answers[i]


@pytest.fixture(scope="module")
def server():
    with TestServer(latency=0.0, seed=0) as srv:
        yield srv


@pytest.fixture
def bbh_task(data_dir):
    return heldout.load_task("bbh/word_sorting", profile="sepo", data_dir=data_dir)


def test_a_verdict_is_recorded_once_every_one_before_it_is_in_and_the_ledger_keeps_the_order_asked(
        server, bbh_task, tmp_path):
    with ModelClient("test-model", base_url=server.base_url) as client:
        worker = ReorderingWorker(client)
        session = Session(bbh_task, budget=10, models=SessionModels(worker=worker), run_dir=tmp_path)
        worker.session = session
        asked = [ex.id for ex in bbh_task.splits["train"][:10]][::-1]  # not the split's own order
        before = len(session.ledger) + 1  # and the candidate's entry
        session.view.evaluate(session.view.seed_candidate, "train", asked)
        recorded = [e["data"]["example_id"] for e in session.ledger.entries("evaluation")]
        session.ledger.close()
    # handed over 1, 0, 3, 2 ...: nothing is recorded before answer 0, then two at a time
    assert [n - before for n in worker.seen] == [0, 0, 2, 2, 4, 4, 6, 6, 8, 9]
    assert recorded == asked
    assert verify_ledger(tmp_path).ok


def test_no_ledger_entry_is_appended_while_the_session_waits_interruptibly(server, bbh_task, tmp_path):
    waiting, waits, appended_while_waiting = [False], [0], []

    @contextlib.contextmanager
    def interruptible():
        waiting[0], waits[0] = True, waits[0] + 1
        try:
            yield
        finally:
            waiting[0] = False

    with ModelClient("test-model", base_url=server.base_url, concurrency=4) as client:
        session = Session(bbh_task, budget=24, models=SessionModels(worker=client), run_dir=tmp_path)
        session.service.interruptible = interruptible
        append = session.ledger.append_entry

        def watched_append(kind, data, **kwargs):
            if waiting[0]:
                appended_while_waiting.append(kind)
            return append(kind, data, **kwargs)
        session.ledger.append_entry = watched_append

        def optimizer(view, seed):
            for k in range(3):
                view.evaluate({"instruction": f"Sort the words ({k})."}, "train", [ex["id"] for ex in view.train[:8]])
            return view.seed_candidate
        session.run(optimizer)
    assert waits[0] >= 24  # a wait for each answer of the optimisation, and the held-out scoring's
    assert appended_while_waiting == []
    assert verify_ledger(tmp_path).ok


# -- the run record: encoded once ------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4) | st.integers(0, 20), inner, max_size=4), max_leaves=20)


def record_with(**fields) -> RunRecord:
    given_fields = {"task": "t", "profile": "p", "seed": 0, "method": "m", "status": "ok", "budget": {}, "policy": {},
                    "limits": {}, "options": {}, "drift": None, "final_candidate": None, "final_candidate_id": None,
                    "test_verdicts": [], "val_verdicts": [], "test_score": None, "val_score": None, "usage": {},
                    "trajectory": [], "lineage": []}
    return RunRecord(**{**given_fields, **fields})


@settings(max_examples=200, deadline=None)
@given(extra=st.dictionaries(st.text(max_size=6), json_values, max_size=4))
def test_a_records_sealed_content_is_what_a_reader_digests_whatever_its_fields_hold(extra):
    record = record_with(extra=extra)
    assert record.sealed_content() == canonical_json(record.content())


def test_a_record_saved_from_its_sealed_content_reads_back_as_the_record_and_digests_the_same(tmp_path):
    record = record_with(seed=3, options={"k": (1, 2)}, final_candidate={"instruction": "Sort.\u2603"},
                         test_verdicts=[{"score": 1.0, "output": {"text": "a\\nb"}}], extra={"x": float("inf")})
    sealed = record.sealed_content()
    record.ledger_head, record.ledger_entries = "ab" * 32, 7
    record.signature = {"key_id": "k", "signature": "s"}
    (tmp_path / "plain").mkdir(), (tmp_path / "sealed").mkdir()
    record.save(tmp_path / "plain")
    record.save(tmp_path / "sealed", sealed)
    plain, from_sealed = RunRecord.load(tmp_path / "plain"), RunRecord.load(tmp_path / "sealed")
    assert from_sealed == plain
    assert from_sealed.digest() == plain.digest() == record.digest(sealed)
