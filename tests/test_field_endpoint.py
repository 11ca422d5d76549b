"""Field conditions: a model endpoint that answers 200 with something that is not a completion.

In the lab the endpoint is heldout's own deterministic test server. In the field it is a proxy, a
gateway or a server under load, which can answer 200 with an empty body, a body cut short, no
choice, a body that never ends, or usage figures that are not token counts. Each is the
infrastructure's failure (a ModelError, never a verdict's text, never a number booked), through
the client's real transport against a loopback server this file starts."""

from __future__ import annotations

import json
import socket

import pytest

from heldout.contracts import INFRASTRUCTURE_ERROR_KINDS
from heldout.models import ChatRequest, ModelClient, ModelError
from socket_server import ScriptedSocketServer, read_request


class OneAnswerServer(ScriptedSocketServer):
    """Loopback HTTP/1.1 that reads a request's head and body, sends the byte strings
    ``answer(server)`` gives one by one, then closes the connection. ``sent`` counts the bytes the
    client took before it hung up."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.sent = 0
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            if read_request(reader) is None:
                return
            try:
                for data in self.answer(self):
                    conn.sendall(data)
                    self.sent += len(data)
            except OSError:
                return


def ok(body: bytes, extra_head: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body), extra_head, body)


def ask(server: OneAnswerServer, **kwargs) -> ModelClient:
    return ModelClient("test-model", server.base_url, max_retries=0, backoff_base=0.001, backoff_cap=0.01,
                       **kwargs)


REQUEST = ChatRequest(messages=({"role": "user", "content": "q"},), model="test-model")
ANSWERS = {
    "an empty body": ok(b""),
    "no choice": ok(b'{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 0}}'),
    "a body cut short by a proxy": ok(b'{"choices": [{"message": {"role": "assistant", "cont'),
    "a null content (a filter)": ok(b'{"choices": [{"message": {"content": null}, '
                                    b'"finish_reason": "content_filter"}]}'),
    "bytes that are not UTF-8": ok(b'{"choices": [{"message": {"content": "\xff\xfe"}}]}'),
    "a length past the body, then a hang-up": b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{\"choices\": [",
}


@pytest.mark.parametrize("answer", sorted(ANSWERS))
def test_a_200_that_is_not_a_completion_is_the_infrastructures_failure(answer):
    with OneAnswerServer(lambda server: [ANSWERS[answer]]) as server, ask(server) as client:
        with pytest.raises(ModelError) as err:
            client.complete(REQUEST)
    assert err.value.kind in ("bad_response", "connection")
    assert "model_error" in INFRASTRUCTURE_ERROR_KINDS  # what a session makes of any ModelError
    assert client.usage.total().failures == 1


def test_an_answer_whose_body_never_ends_is_cut_off_as_a_failure_not_read_into_memory():
    """The server declares a body of 1 TiB of JSON whitespace (valid before a value) and streams
    up to 48 MiB of it; a client with a bounded body stops reading long before."""
    chunk = b" " * (1 << 20)

    def endless(server: OneAnswerServer) -> list[bytes]:
        return [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 40)] + [chunk] * 48

    with OneAnswerServer(endless) as server, ask(server, timeout=5.0) as client:
        with pytest.raises(ModelError):
            client.complete(REQUEST)
    assert server.sent < 24 << 20, f"the client read {server.sent >> 20} MiB of one answer"


@pytest.mark.parametrize("usage", [{"prompt_tokens": -100000, "completion_tokens": 5},
                                   {"prompt_tokens": 2.5, "completion_tokens": 1}],
                         ids=["negative", "fraction"])
def test_usage_that_is_no_token_count_is_a_failure_never_booked(usage):
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "x"}}], "usage": usage}).encode()
    with OneAnswerServer(lambda server: [ok(body)]) as server, ask(server) as client:
        with pytest.raises(ModelError) as err:
            client.complete(REQUEST)
    assert err.value.kind == "bad_response"
