"""When a session records an evaluation: each fresh verdict joins the ledger's batch as soon as it
and every one asked before it are scored (while later answers are still in flight), in the order
asked whatever order the answers come in, and never while the session waits interruptibly for an
answer (a stop raised there must not land in a ledger write). Against the real loopback server."""

from __future__ import annotations

import contextlib

import pytest

import heldout
from heldout.evaluators.ledger import verify_ledger
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
        append = session.ledger.append

        def watched_append(kind, data, **kwargs):
            if waiting[0]:
                appended_while_waiting.append(kind)
            return append(kind, data, **kwargs)
        session.ledger.append = watched_append

        def optimizer(view, seed):
            for k in range(3):
                view.evaluate({"instruction": f"Sort the words ({k})."}, "train", [ex["id"] for ex in view.train[:8]])
            return view.seed_candidate
        session.run(optimizer)
    assert waits[0] >= 24  # a wait for each answer of the optimisation, and the held-out scoring's
    assert appended_while_waiting == []
    assert verify_ledger(tmp_path).ok
