"""heldout's model servers refuse what the OpenAI API refuses, cap what they read and stop working
for a client that has gone (issue 55). The adversary is a client of the loopback endpoint: a
candidate's prompt, an optimizer with the base URL, or any local process. It asks for -7 or 10^400
tokens, 1000 choices, best_of 10^9, an unknown role; it sends a 20 MB body or a Content-Length
it never sends; it asks for a long answer and hangs up. Each is answered here over real HTTP
against a server the test starts on 127.0.0.1: a 400 or 413 OpenAI-style JSON error (the backend
never called), and an abandoned answer stops and frees its slot for the next client.

The backend behind the slot-pool tests is a stand-in for a slow model (a token every 20 ms, each
passed to ``on_text`` as llama.cpp's are); the same behaviour with the real SmolLM2 model is in
tests/test_local_model_limits.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from heldout.models import ChatRequest, ModelClient, ModelError
from heldout.models.backends.pool import SlotPool
from heldout.models.openai_rules import MAX_TOKENS_CEILING
from heldout.models.server import MAX_BODY_BYTES, ChatServer, Completion
from heldout.models.testserver import RecordingBackend, TestServer
from heldout.models import model_failure_kind
from heldout.contracts import INFRASTRUCTURE_ERROR_KINDS

CHAT = [{"role": "user", "content": "Is 4 even?"}]


def post_raw(base_url: str, path: str, body: bytes) -> httpx.Response:
    return httpx.post(base_url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)


# -- what the OpenAI API refuses -------------------------------------------------------------------------
# (field the error names, raw JSON of the body beyond model and messages/prompt); one row per refusal
CHAT_REFUSALS = {
    "max_tokens negative": ("max_tokens", '"max_tokens": -7'),
    "max_tokens zero": ("max_tokens", '"max_tokens": 0'),
    "max_tokens 10^400": ("max_tokens", '"max_tokens": 1' + "0" * 400),
    "max_tokens 10^9": ("max_tokens", '"max_tokens": 1000000000'),
    "max_tokens one over the ceiling": ("max_tokens", f'"max_tokens": {MAX_TOKENS_CEILING + 1}'),
    "max_tokens 1e400 (infinite)": ("max_tokens", '"max_tokens": 1e400'),
    "max_tokens a fraction": ("max_tokens", '"max_tokens": 2.5'),
    "max_tokens a string": ("max_tokens", '"max_tokens": "16"'),
    "max_tokens true": ("max_tokens", '"max_tokens": true'),
    "max_completion_tokens negative": ("max_completion_tokens", '"max_completion_tokens": -1'),
    "max_tokens and max_completion_tokens disagree": ("max_completion_tokens",
                                                      '"max_tokens": 5, "max_completion_tokens": 6'),
    "n 1000": ("n", '"n": 1000'),
    "n 129": ("n", '"n": 129'),
    "n zero": ("n", '"n": 0'),
    "n negative": ("n", '"n": -3'),
    "n a string": ("n", '"n": "2"'),
    "n 2 (valid, but one choice is served)": ("n", '"n": 2'),
    "best_of on a chat": ("best_of", '"best_of": 2'),
    "temperature negative": ("temperature", '"temperature": -1'),
    "temperature above 2": ("temperature", '"temperature": 2.5'),
    "temperature NaN": ("temperature", '"temperature": NaN'),
    "temperature a word": ("temperature", '"temperature": "hot"'),
    "top_p above 1": ("top_p", '"top_p": 1.5'),
    "presence_penalty 3": ("presence_penalty", '"presence_penalty": 3'),
    "frequency_penalty -2.5": ("frequency_penalty", '"frequency_penalty": -2.5'),
    "seed beyond 64 bits": ("seed", f'"seed": {2 ** 64}'),
    "seed a string": ("seed", '"seed": "1"'),
    "logit_bias 500": ("logit_bias", '"logit_bias": {"50256": 500}'),
    "logprobs asked for": ("logprobs", '"logprobs": true'),
    "top_logprobs 21": ("top_logprobs", '"top_logprobs": 21'),
    "stream a string": ("stream", '"stream": "yes"'),
    "stream_options without stream": ("stream_options", '"stream_options": {"include_usage": true}'),
    "stop of five sequences": ("stop", '"stop": ["a", "b", "c", "d", "e"]'),
    "user a number": ("user", '"user": 5'),
    "model empty": ("model", '"model": ""'),
    "model a number": ("model", '"model": 3'),
}
MESSAGE_REFUSALS = {
    "an unknown role": ("messages[0].role", [{"role": "hacker", "content": "hi"}]),
    "a role that is a number": ("messages[0].role", [{"role": 5, "content": "hi"}]),
    "a tool message (not served)": ("messages[1].role", [CHAT[0], {"role": "tool", "content": "42"}]),
    "content null": ("messages[0].content", [{"role": "user", "content": None}]),
    "content a list of numbers": ("messages[0].content", [{"role": "user", "content": [1, 2]}]),
    "a message that is a string": ("messages[0]", ["hi"]),
    "no messages": ("messages", []),
    "messages an object": ("messages", {"role": "user", "content": "hi"}),
}
COMPLETION_REFUSALS = {
    "best_of 10^9": ("best_of", '"best_of": 1000000000'),
    "best_of 21": ("best_of", '"best_of": 21'),
    "best_of 3 (valid, but one choice is served)": ("best_of", '"best_of": 3'),
    "logprobs 6": ("logprobs", '"logprobs": 6'),
    "echo": ("echo", '"echo": true'),
    "max_tokens 10^400": ("max_tokens", '"max_tokens": 1' + "0" * 400),
}


def _chat_body(extra: str) -> bytes:
    head = '{"messages": ' + json.dumps(CHAT)
    return (head + (', "model": "m"' if '"model"' not in extra else "") + ", " + extra + "}").encode()


def _assert_openai_400(reply: httpx.Response, param: str, backend: RecordingBackend) -> None:
    assert reply.status_code == 400, reply.text
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"].startswith("bad request: ") and set(error) == {"message", "type", "param", "code"}
    assert backend.calls == []  # refused before any model ran


@pytest.fixture(scope="module")
def recording():
    backend = RecordingBackend()
    with ChatServer(backend) as srv:
        yield srv, backend


@pytest.mark.parametrize("case", sorted(CHAT_REFUSALS))
def test_a_chat_body_the_openai_api_refuses_is_a_400_naming_the_field(case, recording):
    srv, backend = recording
    param, extra = CHAT_REFUSALS[case]
    _assert_openai_400(post_raw(srv.base_url, "/chat/completions", _chat_body(extra)), param, backend)


@pytest.mark.parametrize("case", sorted(MESSAGE_REFUSALS))
def test_chat_messages_the_openai_api_refuses_are_a_400_naming_the_message(case, recording):
    srv, backend = recording
    param, messages = MESSAGE_REFUSALS[case]
    reply = httpx.post(srv.base_url + "/chat/completions", json={"model": "m", "messages": messages}, timeout=30)
    _assert_openai_400(reply, param, backend)


@pytest.mark.parametrize("case", sorted(COMPLETION_REFUSALS))
def test_a_completion_body_the_openai_api_refuses_is_a_400_naming_the_field(case, recording):
    srv, backend = recording
    param, extra = COMPLETION_REFUSALS[case]
    body = ('{"model": "m", "prompt": "Q: Is 4 even?\\nA:", ' + extra + "}").encode()
    _assert_openai_400(post_raw(srv.base_url, "/completions", body), param, backend)


@pytest.mark.parametrize("extra", [
    {"max_tokens": 1}, {"max_tokens": MAX_TOKENS_CEILING}, {"max_completion_tokens": 8}, {"n": 1}, {"n": None},
    {"temperature": 0}, {"temperature": 2}, {"top_p": 0}, {"top_p": 1}, {"seed": -(2 ** 63)}, {"seed": 2 ** 63 - 1},
    {"presence_penalty": -2}, {"frequency_penalty": 2}, {"logit_bias": {"7": -100}}, {"logprobs": False},
    {"stream": False}, {"user": "me"}, {"top_k": 5},  # a vendor field passes through as extra
])
def test_the_edges_of_what_the_openai_api_accepts_are_answered(extra):
    with TestServer() as srv:
        reply = httpx.post(srv.base_url + "/chat/completions", json={"model": "m", "messages": CHAT, **extra},
                           timeout=30)
    assert reply.status_code == 200, reply.text


def test_the_roles_heldout_sends_are_answered():
    messages = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "Is 4 even?"},
                {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Is 5?", "name": "me"}]
    with TestServer() as srv:
        assert httpx.post(srv.base_url + "/chat/completions", json={"model": "m", "messages": messages},
                          timeout=30).status_code == 200


# -- what a body may be ----------------------------------------------------------------------------------
def test_a_20_mb_body_is_413_read_no_further_than_the_cap_and_never_reaches_the_backend(recording):
    srv, backend = recording
    before = srv.stats.too_large
    huge = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (20 << 20)}]}).encode()
    reply = post_raw(srv.base_url, "/chat/completions", huge)
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"
    assert f"limit of {MAX_BODY_BYTES:,}" in reply.json()["error"]["message"]
    assert srv.stats.too_large == before + 1 and backend.calls == []


def _raw_exchange(port: int, head: bytes, body: bytes = b"", *, wait: float = 10) -> bytes:
    """Send ``head`` + ``body`` on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as conn:
        conn.sendall(head + body)
        started, answer = time.monotonic(), b""
        while time.monotonic() - started < wait:
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


@pytest.mark.parametrize("length, status", [
    ("1000000000000", b"413"),  # a Content-Length never sent: answered at once, nothing waited for
    ("abc", b"400"), ("-5", b"400"), ("1e9", b"400"),
])
def test_a_content_length_that_lies_or_is_not_a_number_is_answered_at_once_and_the_connection_closed(
        length, status, recording):
    srv, backend = recording
    started = time.monotonic()
    answer = _raw_exchange(srv.port, f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
                                     f"Content-Type: application/json\r\n\r\n".encode(), b"{}")
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert time.monotonic() - started < 5 and b'"error"' in answer and backend.calls == []


def test_a_chunked_body_is_refused_411(recording):
    srv, backend = recording
    answer = _raw_exchange(srv.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                     b"\r\n", b"2\r\n{}\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 411") and backend.calls == []


def test_a_body_that_never_arrives_holds_nothing(recording, monkeypatch):
    import heldout.models.server as server_module
    monkeypatch.setattr(server_module, "BODY_SECONDS", 1.0)
    srv, backend = recording
    started = time.monotonic()
    answer = _raw_exchange(srv.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n",
                           b'{"model"', wait=10)
    assert answer == b"" and time.monotonic() - started < 5 and backend.calls == []  # closed after 1 s


# -- heldout's own client: a refusal is the candidate's, a failure the infrastructure's ---------------------
def _failure_kind(client: ModelClient, request: ChatRequest) -> tuple[str, int | None]:
    with pytest.raises(ModelError) as failed:
        client.complete(request)
    return model_failure_kind(failed.value), failed.value.status


def test_the_client_books_400_and_413_as_the_candidates_refusal_and_5xx_as_infrastructure():
    with TestServer() as srv, ModelClient("m", base_url=srv.base_url, max_retries=0) as client:
        refused = _failure_kind(client, client.request(CHAT, extra={"top_p": 5}))
        too_large = _failure_kind(client, client.request([{"role": "user", "content": "x" * (2 << 20)}]))
    with TestServer(error_rate=1.0) as failing, ModelClient("m", base_url=failing.base_url, max_retries=0) as client:
        broken = _failure_kind(client, client.request(CHAT))
    assert refused == ("model_refused", 400) and too_large == ("model_refused", 413)
    assert broken == ("model_error", 500)
    assert "model_refused" not in INFRASTRUCTURE_ERROR_KINDS and "model_error" in INFRASTRUCTURE_ERROR_KINDS


# -- a client that goes away -----------------------------------------------------------------------------
class SlowModel:
    """Stands in for a model generating ``tokens`` tokens, one every ``seconds`` (each passed to
    ``on_text`` as the llama.cpp backend passes its tokens); ``generated`` counts every token made.
    ``begun`` is set once a completion has its slot; a ``held`` model makes no token until the test
    sets ``release`` (so the slot stays taken for as long as the test needs, however loaded)."""

    model_id = "slow"

    def __init__(self, tokens: int = 1000, seconds: float = 0.02, held: bool = False) -> None:
        self.tokens, self.seconds = tokens, seconds
        self.generated = 0
        self._lock = threading.Lock()
        self.begun, self.release = threading.Event(), threading.Event()
        if not held:
            self.release.set()

    def reported_model(self, requested: str) -> str:
        return self.model_id

    def complete(self, call, on_text=None) -> Completion:
        limit = min(call.max_tokens or self.tokens, self.tokens)
        self.begun.set()
        assert self.release.wait(60)
        pieces = []
        for _ in range(limit):
            time.sleep(self.seconds)
            with self._lock:
                self.generated += 1
            pieces.append("w ")
            if on_text is not None:
                on_text("w ")
        return Completion("".join(pieces), 3, limit, "length")


def _until(condition, what: str, seconds: float = 30.0) -> None:
    """Wait until ``condition()`` holds (what the server counts, it counts on its own threads)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _abandon(port: int, body: dict, *, stream: bool, after: float = 0.0, until=None) -> None:
    """Send a request and hang up without reading the answer: ``after`` seconds later, or once
    ``until()`` holds (a streaming client reads its first chunk first)."""
    data = json.dumps({**body, "stream": stream}).encode()
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(data) + data)
    if stream:
        conn.recv(1024)
    if until is not None:
        _until(until, "the moment to hang up")
    time.sleep(after)
    conn.close()


def _timed(srv: ChatServer, max_tokens: int = 5) -> float:
    started = time.monotonic()
    reply = httpx.post(srv.base_url + "/chat/completions", timeout=60,
                       json={"model": "slow", "messages": CHAT, "max_tokens": max_tokens})
    assert reply.status_code == 200, reply.text
    return time.monotonic() - started


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_frees_the_only_slot_for_the_next_one(stream, capfd):
    model = SlowModel(tokens=1000, seconds=0.02)  # 20 s of tokens if nobody stops it
    with ChatServer(SlotPool([model])) as srv:
        _abandon(srv.port, {"model": "slow", "messages": CHAT, "max_tokens": 1000}, after=0.5, stream=stream)
        _timed(srv)
        made = model.generated  # when the next client had its answer
        # (the abandoned answer is counted after its slot is free: the next one can finish first)
        _until(lambda: srv.stats.abandoned == 1, "the abandoned answer counted")
        stats = srv.stats
    assert "Traceback" not in capfd.readouterr().err  # a client's leaving is no server error
    assert stats.abandoned == 1 and stats.ok == 1
    # the one slot went to the next client after its own 5 tokens and at most ~0.5 s + one check
    # interval of the other's (~30), not its 1000: counted in tokens, so a loaded machine (slower
    # tokens) only makes the margin wider
    assert made == model.generated < 5 + 100, made


def test_a_client_that_hangs_up_while_waiting_for_the_slot_never_takes_it():
    model = SlowModel(tokens=1000, seconds=0.02, held=True)
    pool = SlotPool([model])
    with ChatServer(pool) as srv, ThreadPoolExecutor(1) as threads:
        holder = threads.submit(_timed, srv, 60)
        assert model.begun.wait(30)  # the holder has the one slot, and keeps it until released
        # the second client hangs up while its request waits for that slot (the server has it)
        _abandon(srv.port, {"model": "slow", "messages": CHAT, "max_tokens": 1000}, stream=False,
                 until=lambda: srv.stats.calls == 2)
        _until(lambda: srv.stats.abandoned == 1, "the waiting client's leaving noticed")
        model.release.set()
        holder.result(timeout=60)
        _timed(srv)  # the next client is served
        stats = srv.stats
    assert pool.answered == [2] and stats.abandoned == 1  # the one who left never reached the model
    assert model.generated == 60 + 5


def test_eight_good_requests_are_all_served_beside_a_20_mb_one_on_one_slot():
    model = SlowModel(tokens=1000, seconds=0.01)
    huge = json.dumps({"model": "slow", "messages": [{"role": "user", "content": "x" * (20 << 20)}]}).encode()
    with ChatServer(SlotPool([model])) as srv, ThreadPoolExecutor(9) as threads:
        big = threads.submit(post_raw, srv.base_url, "/chat/completions", huge)
        good = [threads.submit(_timed, srv, 10) for _ in range(8)]
        waits = [g.result(timeout=60) for g in good]
        assert big.result(timeout=60).status_code == 413
    assert max(waits) < 10.0 and model.generated == 80
