"""``ModelClient.complete_each``: every answer of a batch, handed over as it arrives (a session scores
each output while the rest are in flight), the same answers ``complete_many`` gives, against a real
loopback server."""

from __future__ import annotations

import threading
import time

import pytest

from heldout import load_task
from heldout.evaluators.policy import Usage
from heldout.evaluators.scoring import Scorer
from heldout.models import OPTIMISATION, ChatRequest, ModelClient, ModelError
from heldout.models.testserver import TestServer, reply_for

FAST = {"backoff_base": 0.001, "backoff_cap": 0.01}


def word_sorting(i: int) -> ChatRequest:
    return ChatRequest(messages=({"role": "user", "content": f"Sort the following words alphabetically: List: w{i} b a c"},),
                       model="test-model")


class HeldUntilReleased:
    """A fault plan that holds the requests for the words ``w<i>``, i in ``held``, until the test
    sets ``release``, and answers the others at once: which answers come last is the test's
    choice, not a matter of timing (a stall of 0.4 s was one, and on a loaded machine an answer
    that was not held could take as long)."""

    def __init__(self, held) -> None:
        self.held = [f"List: w{i} ".encode() for i in held]
        self.release = threading.Event()

    def decide(self, raw: bytes) -> None:
        if any(word in raw for word in self.held):
            self.release.wait(30)
        return None


HELD = (2, 5, 11, 17, 23)


def test_answers_come_as_they_arrive_and_are_complete_manys_answers():
    requests = [word_sorting(i) for i in range(24)]
    plan, arrived = HeldUntilReleased(HELD), []
    with TestServer() as srv, ModelClient("test-model", srv.base_url, concurrency=24) as client:
        srv.faults = plan
        try:
            for i, answer in client.complete_each(requests):
                arrived.append((i, answer))
                if len(arrived) == 24 - len(HELD):
                    plan.release.set()  # every other answer was handed over while these were held
        finally:
            plan.release.set()
    assert sorted(i for i, _ in arrived) == list(range(24))
    assert all(answer.text == reply_for(list(requests[i].messages)) for i, answer in arrived)
    # handed over as they arrived, not in input order: the held ones last (a batch handed over
    # whole would have come only once the server gave up holding them, 30 s later, in any order)
    assert {i for i, _ in arrived[: 24 - len(HELD)]} == set(range(24)) - set(HELD)
    assert {i for i, _ in arrived[24 - len(HELD):]} == set(HELD)


def test_a_failed_request_is_its_model_error_in_place_and_the_others_are_answered():
    requests = [word_sorting(i) for i in range(20)]
    with TestServer(error_rate=0.4, seed=2) as srv, \
            ModelClient("test-model", srv.base_url, max_retries=0, **FAST) as client:
        arrived = dict(client.complete_each(requests))
    failed = [i for i, a in arrived.items() if isinstance(a, ModelError)]
    assert len(arrived) == 20 and failed and len(failed) < 20
    assert all(arrived[i].status == 500 for i in failed)
    assert all(arrived[i].text == reply_for(list(requests[i].messages)) for i in arrived if i not in failed)


def test_leaving_the_loop_early_cancels_the_requests_still_in_flight():
    with TestServer(latency=0.3) as srv, ModelClient("test-model", srv.base_url, concurrency=2) as client:
        answers = client.complete_each([word_sorting(i) for i in range(10)])
        next(answers)
        answers.close()
        time.sleep(0.8)  # what was not cancelled would have been sent by now
        calls = srv.stats.calls
    assert calls <= 4


def test_a_subclass_that_overrides_complete_many_is_served_by_it():
    class Counting(ModelClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.asked = []

        def complete_many(self, requests, **kwargs):
            self.asked.append(len(requests))
            return super().complete_many(requests, **kwargs)

    with TestServer() as srv, Counting("test-model", srv.base_url) as client:
        arrived = list(client.complete_each([word_sorting(i) for i in range(5)]))
    assert client.asked == [5] and [i for i, _ in arrived] == [0, 1, 2, 3, 4]


def test_a_request_that_is_no_chat_request_is_refused_before_anything_is_sent():
    with TestServer() as srv, ModelClient("test-model", srv.base_url) as client:
        with pytest.raises(TypeError, match="request 1 is a dict"):
            list(client.complete_each([word_sorting(0), {"messages": []}]))
        assert srv.stats.calls == 0


def test_the_scorer_gives_the_same_verdicts_scoring_each_answer_as_it_arrives(word_sorting_task):
    examples = word_sorting_task.splits["train"][:12]
    candidate = word_sorting_task.benchmark.seed_candidate()

    class Whole(ModelClient):  # overrides complete_many: answers in one piece, in input order
        def complete_many(self, requests, **kwargs):
            return super().complete_many(requests, **kwargs)

    verdicts = {}
    with TestServer(stall_rate=0.3, stall_seconds=0.2, seed=1) as srv:
        for client_class in (ModelClient, Whole):
            with client_class("test-model", srv.base_url) as worker:
                scorer = Scorer(word_sorting_task.benchmark, worker)
                got = scorer.score(candidate, examples, OPTIMISATION, Usage())
            verdicts[client_class] = [{**v.to_dict(), "usage": None} for v in got]
    assert verdicts[ModelClient] == verdicts[Whole]
    assert [v["example_id"] for v in verdicts[ModelClient]] == [ex.id for ex in examples]


@pytest.fixture(scope="module")
def word_sorting_task(data_dir):
    return load_task("bbh/word_sorting", "default", data_dir)


def test_a_scorer_interrupted_while_scoring_leaves_no_request_running(word_sorting_task):
    examples = word_sorting_task.splits["train"][:12]

    class Stop(Exception):
        pass

    class StoppedWhileScoring:  # the task, with a stop request arriving as the first output is scored
        def __init__(self, benchmark):
            self._benchmark = benchmark

        def __getattr__(self, name):
            return getattr(self._benchmark, name)

        def score_text(self, *args):
            raise Stop

    with TestServer(latency=0.3) as srv, ModelClient("test-model", srv.base_url, concurrency=2) as worker:
        scorer = Scorer(StoppedWhileScoring(word_sorting_task.benchmark), worker)
        try:
            scorer.score(word_sorting_task.benchmark.seed_candidate(), examples, OPTIMISATION, Usage())
        except Stop as stopped:
            held = stopped  # the traceback (and the scoring frame) stays alive, as a handler's would
            time.sleep(0.8)  # what was not cancelled would have been sent by now
            calls = srv.stats.calls
    assert held and calls <= 4
