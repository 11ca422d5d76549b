"""The one OpenAI-compatible server both backends sit behind: streaming, refusals, failures."""

from __future__ import annotations

import json

import httpx
import pytest

from heldout.models.backends.deterministic import DeterministicBackend
from heldout.models.server import BackendRefusal, ChatCall, ChatServer, Completion
from heldout.models.testserver import TestServer

QUESTION = [{"role": "system", "content": "Answer."},
            {"role": "user", "content": "Sort the following words alphabetically: List: pear apple fig"}]


def events_of(base_url: str, body: dict) -> list[str]:
    with httpx.stream("POST", base_url + "/chat/completions", json=body, timeout=10) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"] == "text/event-stream"
        return [line[len("data: "):] for line in reply.iter_lines() if line.startswith("data: ")]


def test_a_streamed_answer_is_the_plain_answer_in_chunks_with_usage_last():
    with TestServer() as srv:
        plain = httpx.post(srv.base_url + "/chat/completions", json={"model": "m", "messages": QUESTION},
                           timeout=10).json()
        events = events_of(srv.base_url, {"model": "m", "messages": QUESTION, "stream": True,
                                          "stream_options": {"include_usage": True}})
        assert srv.stats.ok == 2
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["model"] for c in chunks} == {"m"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["usage"] == plain["usage"]


def test_without_include_usage_the_stream_carries_no_usage_chunk():
    with TestServer() as srv:
        events = events_of(srv.base_url, {"model": "m", "messages": QUESTION, "stream": True, "max_tokens": 2})
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["choices"] for c in chunks) and chunks[-1]["choices"][0]["finish_reason"] == "length"


class RefusingBackend:
    """Refuses every prompt longer than ``limit`` characters; a crash on the word 'crash'."""

    model_id = "refuser"

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def reported_model(self, requested: str) -> str:
        return self.model_id

    def complete(self, call: ChatCall, on_text=None) -> Completion:
        prompt = " ".join(m["content"] for m in call.messages)
        if "crash" in prompt:
            raise RuntimeError("the backend fell over")
        if len(prompt) > self.limit:
            raise BackendRefusal(f"prompt of {len(prompt)} characters exceeds {self.limit}")
        return DeterministicBackend().complete(call, on_text)


@pytest.mark.parametrize("stream", [False, True])
def test_refusals_are_400_and_backend_failures_500_each_with_one_clear_message(stream):
    with ChatServer(RefusingBackend(limit=20)) as srv:
        def post(content: str) -> httpx.Response:
            return httpx.post(srv.base_url + "/chat/completions", timeout=10, json={
                "model": "m", "messages": [{"role": "user", "content": content}], "stream": stream})

        refused, crashed, fine = post("x" * 50), post("crash"), post("Is 4 even?")
        assert refused.status_code == 400 and "exceeds 20" in refused.json()["error"]["message"]
        assert crashed.status_code == 500
        assert crashed.json()["error"]["message"] == "backend failed: RuntimeError: the backend fell over"
        assert fine.status_code == 200
        assert srv.stats.bad_requests == 1 and srv.stats.http_500 == 1 and srv.stats.ok == 1
        assert httpx.get(srv.base_url + "/models").json()["data"] == [{"id": "refuser", "object": "model"}]


def test_bad_decoding_parameters_are_refused_before_the_backend_runs():
    with TestServer() as srv:
        for bad in ({"temperature": -1}, {"temperature": "hot"}, {"model": 3}):
            body = {"model": "m", "messages": QUESTION, **bad}
            reply = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=10)
            assert reply.status_code == 400 and reply.json()["error"]["message"].startswith("bad request")
        assert srv.stats.bad_requests == 3 and srv.stats.ok == 0


def test_the_model_server_refuses_to_listen_beyond_loopback():
    with pytest.raises(ValueError, match="loopback"):
        ChatServer(DeterministicBackend(), host="0.0.0.0")
