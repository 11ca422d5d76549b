"""The OpenAI ``/v1/completions`` endpoint (a prompt string in, ``choices[0].text`` out) beside
chat completions: one server, one stop rule, one client path (replay, cache, retries, usage).

Every test talks to a real HTTP server on loopback."""

from __future__ import annotations

import json

import httpx
import pytest

from heldout.contracts import canonical_json, sha256_text
from heldout.models import ModelClient, Recorder, Replay, ReplayMiss, ResponseCache
from heldout.models.server import ChatServer
from heldout.models.testserver import RecordingBackend, TestServer

PROMPT = "Q: not ( True ) and ( True ) is\nA: Let's think step by step.\n"


def complete(base_url: str, body: dict) -> httpx.Response:
    return httpx.post(base_url + "/completions", json={"model": "m", **body}, timeout=10)


def events_of(base_url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", base_url + "/completions", json={"model": "m", **body}, timeout=10) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"] == "text/event-stream"
        events = [line[len("data: "):] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# -- the endpoint ------------------------------------------------------------------------------------
def test_a_completion_answers_the_prompt_in_choices_text_and_counts_its_tokens():
    backend = RecordingBackend()
    with ChatServer(backend) as srv:
        reply = complete(srv.base_url, {"prompt": PROMPT})
        assert reply.status_code == 200 and srv.stats.ok == 1
    body = reply.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["text"].endswith("So the answer is False.") and choice["finish_reason"] == "stop"
    assert "message" not in choice
    assert body["usage"]["prompt_tokens"] == len(PROMPT.split())
    assert body["usage"]["completion_tokens"] == len(choice["text"].split())
    (call,) = backend.calls
    assert call.is_completion and call.prompt == PROMPT and call.messages == []  # the bytes, untouched


def test_a_completion_ends_before_its_stop_sequence_and_at_max_tokens():
    with TestServer() as srv:
        full = complete(srv.base_url, {"prompt": PROMPT}).json()["choices"][0]["text"]
        word = full.split()[2]
        cut = complete(srv.base_url, {"prompt": PROMPT, "stop": [word, "never"]}).json()["choices"][0]
        short = complete(srv.base_url, {"prompt": PROMPT, "max_tokens": 2}).json()["choices"][0]
    assert cut["text"] == full[:full.index(word)] and cut["finish_reason"] == "stop"
    assert short["text"] == " ".join(full.split()[:2]) and short["finish_reason"] == "length"


@pytest.mark.parametrize("stop", [None, ["answer"]])
def test_a_streamed_completion_is_the_plain_one_in_text_chunks_with_usage_last(stop):
    extra = {} if stop is None else {"stop": stop}
    with TestServer() as srv:
        plain = complete(srv.base_url, {"prompt": PROMPT, **extra}).json()
        chunks = events_of(srv.base_url, {"prompt": PROMPT, "stream": True, **extra,
                                          "stream_options": {"include_usage": True}})
    assert {c["object"] for c in chunks} == {"text_completion"}
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == plain["choices"][0]["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["usage"] == plain["usage"]


@pytest.mark.parametrize("body, says", [
    ({}, "prompt is required"),
    ({"prompt": ["two", "prompts"]}, "prompt must be a string"),
    ({"prompt": 7}, "prompt must be a string"),
    ({"prompt": None}, "prompt must be a string"),
    ({"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "not both"),
    ({"prompt": "x", "stop": 5}, "stop must be"),
    ({"prompt": "x", "model": 3}, "model must be a string"),
])
def test_a_bad_completion_body_is_a_clear_400_json_error(body, says):
    backend = RecordingBackend()
    with ChatServer(backend) as srv:
        reply = httpx.post(srv.base_url + "/completions", json={"model": "m", **body}, timeout=10)
        assert srv.stats.bad_requests == 1
    assert reply.status_code == 400 and reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert says in error["message"] and error["type"] == "invalid_request_error"
    assert "Traceback" not in reply.text and backend.calls == []


def test_a_chat_request_with_a_prompt_or_without_messages_is_refused_too():
    with TestServer() as srv:
        both = httpx.post(srv.base_url + "/chat/completions", timeout=10, json={
            "model": "m", "prompt": "x", "messages": [{"role": "user", "content": "x"}]})
        prompt_only = httpx.post(srv.base_url + "/chat/completions", json={"model": "m", "prompt": "x"}, timeout=10)
        not_json = httpx.post(srv.base_url + "/completions", content=b"{prompt", timeout=10)
    assert both.status_code == 400 and "not both" in both.json()["error"]["message"]
    assert prompt_only.status_code == 400 and "/v1/completions" in prompt_only.json()["error"]["message"]
    assert not_json.status_code == 400 and not_json.json()["error"]["message"].startswith("bad request")


# -- the client: one path for chat and completion ----------------------------------------------------
def test_the_client_sends_a_completion_to_the_completions_endpoint_and_books_its_tokens():
    backend = RecordingBackend()
    with ChatServer(backend) as srv, ModelClient("m", base_url=srv.base_url) as client:
        answer = client.complete(client.completion_request(PROMPT, max_tokens=50,
                                                           extra={"stop": ["\n\n"]}, channel="worker-deployment"))
        chat = client.complete(client.request([{"role": "user", "content": PROMPT}]))
    first, second = backend.calls
    assert first.prompt == PROMPT and first.stop == ("\n\n",) and first.max_tokens == 50
    assert second.prompt is None and second.messages == [{"role": "user", "content": PROMPT}]
    assert answer.text.endswith("So the answer is False.") and answer.source == "endpoint"
    assert answer.request_key != chat.request_key  # a prompt and a chat of the same text are two requests
    usage = client.usage.channel("worker-deployment")
    assert usage.endpoint_calls == 1 and usage.prompt_tokens == len(PROMPT.split())


def test_a_completion_is_cached_and_replayed_like_a_chat(tmp_path):
    recording = tmp_path / "calls.jsonl"
    with TestServer() as srv:
        with ModelClient("m", base_url=srv.base_url, cache=ResponseCache(tmp_path / "cache.db"),
                         recorder=Recorder(recording)) as client:
            first = client.complete(client.completion_request(PROMPT))
            again = client.complete(client.completion_request(PROMPT))
        assert srv.stats.calls == 1
    assert (first.source, again.source) == ("endpoint", "cache") and again.text == first.text
    replaying = ModelClient("m", replay=Replay(recording))
    replayed = replaying.complete(replaying.completion_request(PROMPT))
    assert replayed.source == "replay" and replayed.text == first.text
    with pytest.raises(ReplayMiss, match="prompt 'another'"):
        replaying.complete(replaying.completion_request("another"))


def test_a_chat_requests_cache_key_is_what_it_was_before_completions_existed():
    client = ModelClient("m", base_url="http://127.0.0.1:9/v1")
    request = client.request([{"role": "user", "content": "hi"}], max_tokens=5)
    before = sha256_text(canonical_json({"model": "m", "temperature": 0.0, "max_tokens": 5, "extra": [],
                                         "messages": [{"role": "user", "content": "hi"}], "replicate": 0}))
    assert request.cache_key() == before  # caches and recordings made before stay valid
    assert "prompt" not in request.payload() and client.completion_request("hi").payload()["prompt"] == "hi"


def test_a_request_is_a_chat_or_a_completion_never_both():
    client = ModelClient("m", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="not both"):
        client.request([{"role": "user", "content": "x"}], prompt="x")
    with pytest.raises(ValueError, match="prompt must be a str"):
        client.completion_request(b"bytes")
    with pytest.raises(ValueError, match="may not set 'prompt'"):
        client.request([{"role": "user", "content": "x"}], extra={"prompt": "x"})
