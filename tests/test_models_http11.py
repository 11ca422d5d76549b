"""The model client's own HTTP/1.1 transport (heldout/models/http11.py) against a loopback server
that answers each request with exactly the bytes a test scripts: every way an answer can be framed
(Content-Length, chunked, until close, after an interim 100), and what a broken or hostile endpoint
does (hangs up mid-answer, speaks something else, never answers, sends more than asked). A
failure of the endpoint is a ModelError of the connection or timeout kind, never an answer; an
answer is never read from the wrong request's bytes."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Callable

import pytest

from heldout.models import ChatRequest, ModelClient, ModelError
from heldout.models.http11 import MAX_HEAD_BYTES
from socket_server import ScriptedSocketServer, read_request


def completion(text: str) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()


def request(text: str) -> ChatRequest:
    return ChatRequest(messages=({"role": "user", "content": text},), model="test-model")


class ScriptedServer(ScriptedSocketServer):
    """Loopback HTTP/1.1: reads each request (head and Content-Length body) and hands the
    connection, the request's number on it and its parsed JSON body to ``answer``, which writes
    whatever bytes the test wants and returns False to close the connection. ``connections``
    counts the connections accepted; ``heads`` keeps every request head received."""

    def __init__(self, answer: Callable[[socket.socket, int, dict], bool]) -> None:
        self.answer = answer
        self.heads: list[bytes] = []
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            for number in range(1_000):
                request = read_request(reader)
                if request is None:
                    return  # the client closed the connection
                self.heads.append(request[0])
                try:
                    if not self.answer(conn, number, json.loads(request[1])):
                        return
                except OSError:
                    return


def asked(body: dict) -> str:
    return body["messages"][0]["content"]


def client_of(server: ScriptedServer, **kwargs) -> ModelClient:
    return ModelClient("test-model", server.base_url, max_retries=0, backoff_base=0.001, backoff_cap=0.01, **kwargs)


# -- how an answer is framed ---------------------------------------------------------------------
def test_a_chunked_answer_with_extensions_and_trailers_is_read_whole_and_the_connection_reused():
    def chunked(conn, number, body):
        payload = completion(f"answer to {asked(body)}")
        pieces = [payload[:7], payload[7:8], payload[8:]]
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n")
        for k, piece in enumerate(pieces):
            conn.sendall(b"%x;ext=%d\r\n" % (len(piece), k) + piece + b"\r\n")
            time.sleep(0.01)  # separate reads: the parser resumes mid-body
        conn.sendall(b"0\r\nX-Trailer: yes\r\n\r\n")
        return True

    with ScriptedServer(chunked) as server, client_of(server, concurrency=1) as client:
        texts = [r.text for r in client.complete_many([request(f"q{i}") for i in range(3)])]
    assert texts == ["answer to q0", "answer to q1", "answer to q2"]
    assert server.connections == 1


def test_an_answer_delimited_by_the_close_is_read_to_the_end_and_its_connection_not_reused():
    def until_close(conn, number, body):
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + completion(asked(body)))
        return False

    with ScriptedServer(until_close) as server, client_of(server, concurrency=1) as client:
        texts = [client.complete(request(f"q{i}")).text for i in range(3)]
    assert texts == ["q0", "q1", "q2"] and server.connections == 3


def test_an_interim_100_continue_is_skipped_for_the_answer_after_it():
    def interim(conn, number, body):
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        time.sleep(0.01)
        payload = completion(asked(body))
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        return True

    with ScriptedServer(interim) as server, client_of(server) as client:
        assert client.complete(request("q")).text == "q"


def test_a_request_carries_its_host_length_and_key_in_one_well_formed_head():
    def echo(conn, number, body):
        payload = completion(asked(body))
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        return True

    with ScriptedServer(echo) as server, client_of(server, api_key="sk-test") as client:
        assert client.complete(request("caf\u00e9 \u2603")).text == "caf\u00e9 \u2603"
    head = server.heads[0].decode("latin-1")
    port = server.base_url.split(":")[2].split("/")[0]
    assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{port}\r\n" in head and "Authorization: Bearer sk-test\r\n" in head


# -- a broken or hostile endpoint ------------------------------------------------------------------
@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{\"choices\"",  # hangs up mid-body
    b"SSH-2.0-OpenSSH_9.6\r\n\r\n",  # another protocol
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",  # two lengths
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",  # a framing it does not speak
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # a chunk size that is no number
    b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * MAX_HEAD_BYTES,  # a head without end
    b"",  # accepts the request and closes without a word
], ids=["hangs-up-mid-body", "not-http", "conflicting-lengths", "unknown-encoding", "bad-chunk", "endless-head",
        "silent-close"])
def test_a_broken_answer_is_a_connection_error_never_an_answer(reply):
    def broken(conn, number, body):
        conn.sendall(reply)
        return False

    with ScriptedServer(broken) as server, client_of(server) as client:
        with pytest.raises(ModelError) as err:
            client.complete(request("q"))
    assert err.value.kind == "connection"
    assert client.usage.total().failures == 1


def test_an_endpoint_that_never_answers_times_out_and_one_that_trickles_does_not():
    def silent(conn, number, body):
        time.sleep(5)
        return False

    with ScriptedServer(silent) as server, client_of(server, timeout=0.3) as client:
        started = time.perf_counter()
        with pytest.raises(ModelError) as err:
            client.complete(request("q"))
    assert err.value.kind == "timeout" and time.perf_counter() - started < 4.5

    def trickle(conn, number, body):  # 1.6 s in all, never 1 s without a byte: the timeout is of silence
        payload = completion(asked(body))
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload))
        for k in range(4):
            time.sleep(0.4)
            conn.sendall(payload[k * len(payload) // 4:(k + 1) * len(payload) // 4])
        return True

    with ScriptedServer(trickle) as server, client_of(server, timeout=1.0) as client:
        assert client.complete(request("slow")).text == "slow"


def test_bytes_nobody_asked_for_end_their_connection_and_are_never_read_as_the_next_answer():
    def extra(conn, number, body):
        payload = completion(asked(body))
        # the answer, then the start of another answer nobody asked for
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        time.sleep(0.05)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(completion("forged")) + completion("forged"))
        return True

    with ScriptedServer(extra) as server, client_of(server, concurrency=1) as client:
        first = client.complete(request("q0")).text
        time.sleep(0.2)  # the unasked bytes arrive while the connection is idle
        second = client.complete(request("q1")).text
    assert (first, second) == ("q0", "q1")


def test_a_request_abandoned_mid_flight_closes_its_connection_before_its_answer_comes():
    received, release, closed_before_its_answer = threading.Event(), threading.Event(), threading.Event()

    def late_first(conn, number, body):
        if asked(body) == "slow":
            received.set()
            release.wait(10)  # answered only once the caller has left
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not closed_before_its_answer.is_set():
                try:
                    if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        closed_before_its_answer.set()  # the client's end is closed: nothing waits for it
                except BlockingIOError:
                    time.sleep(0.01)
        payload = completion(asked(body))
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        return True

    async def leave_early(client: ModelClient) -> None:
        # the caller leaves once the server has the request (a fixed 0.2 s could pass before it was
        # even sent on a loaded machine, and then nothing was abandoned mid-flight)
        asking = asyncio.ensure_future(client.acomplete(request("slow")))
        while not received.is_set():
            await asyncio.sleep(0.01)
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
        await asyncio.sleep(0.05)  # the transport closes its socket in a callback of this loop, which ends next

    with ScriptedServer(late_first) as server, client_of(server, concurrency=1) as client:
        asyncio.run(leave_early(client))
        release.set()
        assert client.complete(request("next")).text == "next"
    assert closed_before_its_answer.is_set() and server.connections == 2


def test_an_api_key_with_a_line_break_is_a_configuration_error_and_nothing_is_sent():
    with ScriptedServer(lambda conn, number, body: False) as server:
        with client_of(server, api_key="sk-x\r\nX-Injected: 1") as client:
            with pytest.raises(ModelError) as err:
                client.complete(request("q"))
    assert err.value.kind == "config" and server.heads == [] and server.connections == 0
