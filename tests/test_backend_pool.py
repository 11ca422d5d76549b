"""`serve-model --slots N`: several copies of one backend answer requests in parallel, and which copy
answers never changes the text. The copies here are the test double, held at a barrier so that
"in parallel" is shown by two requests being inside the backend at once (no timing)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from heldout.models.backends.deterministic import DeterministicBackend
from heldout.models.backends.pool import SlotPool
from heldout.models.server import ChatServer


class MeetingBackend(DeterministicBackend):
    """The test double, except that each answer first waits until ``parties`` requests are inside
    a backend at the same time (a shared barrier), giving up after ``patience`` seconds."""

    def __init__(self, barrier: threading.Barrier, patience: float = 30.0) -> None:
        super().__init__()
        self.barrier, self.patience = barrier, patience

    def complete(self, call, on_text=None):
        self.barrier.wait(timeout=self.patience)
        return super().complete(call, on_text)


def ask(server: ChatServer, content: str) -> str:
    body = {"model": "heldout-test", "messages": [{"role": "user", "content": content}], "max_tokens": 20}
    reply = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


def test_two_slots_hold_two_requests_inside_the_model_at_once():
    barrier = threading.Barrier(2)
    pool = SlotPool([MeetingBackend(barrier), MeetingBackend(barrier)])
    with ChatServer(pool) as server, ThreadPoolExecutor(2) as threads:
        answers = list(threads.map(lambda q: ask(server, q), ["What is 2+2?", "Name a colour."]))
    assert all(answers) and sorted(pool.answered) == [1, 1]  # each copy answered one, at the same time


def test_one_slot_answers_one_request_at_a_time():
    barrier = threading.Barrier(2)
    pool = SlotPool([MeetingBackend(barrier, patience=0.5)])
    with ChatServer(pool) as server, ThreadPoolExecutor(2) as threads:
        pending = [threads.submit(ask, server, q) for q in ("What is 2+2?", "Name a colour.")]
        # the first request waits at the barrier for a second that cannot get in until it leaves
        assert all(isinstance(p.exception(timeout=60), AssertionError) for p in pending)
    assert pool.answered == [2]


def test_the_text_does_not_depend_on_which_slot_answers():
    single = SlotPool([DeterministicBackend()])
    pooled = SlotPool([DeterministicBackend() for _ in range(3)])
    questions = [f"Question {i}: is {i} even?" for i in range(12)]
    with ChatServer(single) as one, ChatServer(pooled) as many, ThreadPoolExecutor(6) as threads:
        alone = [ask(one, q) for q in questions]
        together = list(threads.map(lambda q: ask(many, q), questions))
    assert together == alone and sum(pooled.answered) == 12


def test_a_pool_serves_one_model_and_needs_a_copy():
    with pytest.raises(ValueError, match="at least one"):
        SlotPool([])
    other = DeterministicBackend()
    other.model_id = "another-model"
    with pytest.raises(ValueError, match="one model"):
        SlotPool([DeterministicBackend(), other])
