"""ModelClient against the real loopback test server: concurrency, retries, accounting, errors."""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import gc
import random
import socket
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import pytest
from hypothesis import given, settings, strategies as st

from heldout.contracts import Message
from heldout.models import (
    BatchError,
    ChatRequest,
    ModelClient,
    ModelError,
    ResponseCache,
    backoff_delay,
)
from heldout.models.client import _parse_completion
from heldout.models.testserver import TestServer, count_tokens, reply_for
from socket_server import ScriptedSocketServer, read_request

FAST = {"backoff_base": 0.001, "backoff_cap": 0.01}


def word_sorting(i: int, instruction: str = "Sort the words.") -> ChatRequest:
    return ChatRequest(
        messages=({"role": "system", "content": instruction},
                  {"role": "user", "content": f"Sort the following words alphabetically: List: w{i} b a{i % 7} c"}),
        model="test-model")


# -- the request ---------------------------------------------------------------------------------
def test_cache_key_covers_model_decoding_messages_and_replicate_but_not_channel():
    base = word_sorting(1)
    variants = [
        ChatRequest(base.messages, "other-model"),
        ChatRequest(base.messages, base.model, temperature=0.7),
        ChatRequest(base.messages, base.model, max_tokens=5),
        ChatRequest(base.messages, base.model, replicate=1),
        ChatRequest(base.messages, base.model, extra={"top_p": 0.5}),
        word_sorting(2),
    ]
    keys = {base.cache_key()} | {v.cache_key() for v in variants}
    assert len(keys) == len(variants) + 1
    same = ChatRequest(list(base.messages), base.model, temperature=0, channel="architect")
    assert same.cache_key() == base.cache_key()


def test_request_normalises_its_inputs_and_copies_messages():
    msgs = [{"role": "user", "content": "hi"}]
    request = ChatRequest(msgs, "m", extra=[("top_p", 0.9), ("seed", 3)])
    key = request.cache_key()
    msgs[0]["content"] = "changed afterwards"
    assert request.cache_key() == key
    assert request.extra == (("seed", 3), ("top_p", 0.9))
    assert ChatRequest([Message("user", "hi")], "m").messages == ({"role": "user", "content": "hi"},)
    assert hash(request) == hash(ChatRequest([{"role": "user", "content": "hi"}], "m",
                                             extra={"seed": 3, "top_p": 0.9}))


texts = st.text(max_size=30)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                           "content": texts}), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(messages=messages, replicate=st.integers(0, 5), temperature=st.sampled_from([0, 0.0, 0.7, 1]),
       seed=st.integers(0, 3))
def test_cache_key_is_a_function_of_content_not_of_construction(messages, replicate, temperature, seed):
    a = ChatRequest(messages, "m", temperature=temperature, replicate=replicate, extra={"seed": seed, "top_p": 1})
    rebuilt = [{"content": m["content"], "role": m["role"]} for m in messages]  # other key order
    b = ChatRequest(tuple(rebuilt), "m", temperature=float(temperature), replicate=replicate,
                    extra=[("top_p", 1), ("seed", seed)], channel="architect")
    assert a.cache_key() == b.cache_key() == ChatRequest.from_dict(a.to_dict()).cache_key()
    assert ChatRequest(messages, "m", temperature=temperature, replicate=replicate + 1,
                       extra={"seed": seed, "top_p": 1}).cache_key() != a.cache_key()


@pytest.mark.parametrize("bad, message", [
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": None}]}, "content"),
    ({"messages": []}, "empty"),
    ({"messages": "hello"}, "sequence"),
    ({"channel": "worker"}, "channel"),
    ({"temperature": 3.0}, "temperature"),
    ({"replicate": -1}, "replicate"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"extra": {"model": "x"}}, "extra"),
    ({"extra": {"stop": object()}}, "JSON"),
])
def test_malformed_requests_are_refused_with_a_clear_error(bad, message):
    fields = {"messages": [{"role": "user", "content": "q"}], "model": "m", **bad}
    with pytest.raises((ValueError, TypeError), match=message):
        ChatRequest(**fields)


# -- configuration -------------------------------------------------------------------------------
def test_missing_base_url_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ModelError, match="OPENAI_BASE_URL") as err:
        ModelClient("m")
    assert err.value.kind == "config"
    with pytest.raises(ModelError, match="http://"):
        ModelClient("m", base_url="127.0.0.1:8000/v1")


def test_base_url_and_key_come_from_the_environment(monkeypatch):
    with TestServer(api_key="sk-test") as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        client = ModelClient("test-model")
        assert "sk-test" not in repr(client)
        [response] = client.complete_many([word_sorting(0)])
        assert response.text.endswith(".") and srv.stats.ok == 1


def test_wrong_key_fails_at_once_without_retrying():
    with TestServer(api_key="sk-right") as srv:
        client = ModelClient("test-model", srv.base_url, "sk-wrong", **FAST)
        with pytest.raises(ModelError, match="HTTP 401") as err:
            client.complete(word_sorting(0))
        assert err.value.status == 401 and err.value.attempts == 1
        assert srv.stats.calls == 1 and client.usage.total().failures == 1


# -- concurrency and order -----------------------------------------------------------------------
def test_concurrency_bound_is_honoured_and_order_kept():
    requests = [word_sorting(i) for i in range(12)]
    with TestServer(latency=0.1) as srv:
        responses = ModelClient("test-model", srv.base_url, concurrency=3).complete_many(requests)
        stats = srv.stats
    assert 1 < stats.max_in_flight <= 3
    assert stats.calls == 12
    assert [r.text for r in responses] == [reply_for(list(q.messages)) for q in requests]


def test_the_server_answers_no_sooner_than_its_latency_and_in_one_piece():
    # the latency counts from the request's arrival and covers the server's own work: not one
    # byte of the answer may leave before it, and the whole answer leaves together
    body = b'{"model": "test-model", "messages": [{"role": "user", "content": "Sort: List: b a"}]}'
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
    with TestServer(latency=0.3) as srv:
        host, port = srv.base_url.split("//")[1].split("/")[0].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            sent = time.monotonic()
            conn.sendall(request)
            first = conn.recv(1 << 16)
            waited = time.monotonic() - sent
    assert waited >= 0.3
    head, _, rest = first.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    length = int(fields[b"Content-Length"])
    assert len(rest) == length and b"chat.completion" in rest


def test_concurrency_bound_holds_across_caller_threads(tmp_path):
    # e.g. an evaluation server answering several optimizer requests at once, one thread each
    with TestServer(latency=0.05) as srv:
        client = ModelClient("test-model", srv.base_url, concurrency=3, cache=ResponseCache(tmp_path))
        batches = [[word_sorting(i) for i in range(t * 6, t * 6 + 6)] + [word_sorting(99)]
                   for t in range(4)]
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(client.complete_many, batches))
        stats = srv.stats
        client.close()
    assert 1 < stats.max_in_flight <= 3
    assert stats.calls == 4 * 6 + 1  # the request every thread sent was paid for once
    assert [[r.text for r in batch] for batch in results] == \
        [[reply_for(list(q.messages)) for q in batch] for batch in batches]


def test_complete_many_works_inside_a_running_event_loop():
    with TestServer() as srv:
        client = ModelClient("test-model", srv.base_url)

        async def caller():  # e.g. an async evaluation server calling the sync API
            return client.complete_many([word_sorting(1), word_sorting(2)])

        texts = [r.text for r in asyncio.run(caller())]
    assert texts == [reply_for(list(word_sorting(i).messages)) for i in (1, 2)]


def test_a_closed_client_starts_again_on_the_next_call():
    with TestServer() as srv:
        with ModelClient("test-model", srv.base_url) as client:
            client.complete(word_sorting(0))
        client.complete(word_sorting(1))  # after close: a fresh loop and connection pool
        client.close()
        assert srv.stats.ok == 2


def test_a_client_reachable_from_its_callers_context_is_still_collected_with_its_thread_and_sockets():
    """A library keeps its settings in a context variable (DSPy's LM), and those settings reach the
    session and so this client. The client's loop must not keep that context: else the loop's
    thread, a GC root, keeps the client alive, and a study of many cells in one process piles up
    loop threads and keep-alive connections until the endpoint refuses (seen at 150 cells)."""
    settings = contextvars.ContextVar("library_settings")

    def one_cell(server_url: str) -> weakref.ref:
        client = ModelClient("test-model", server_url)
        settings.set({"lm": client})
        client.complete_many([word_sorting(0), word_sorting(1)])
        return weakref.ref(client)

    def loop_threads() -> set[threading.Thread]:  # other tests' clients may still be ending theirs
        return {t for t in threading.enumerate() if t.name == "heldout-model-client"}

    with TestServer() as srv:
        before = loop_threads()
        cells = [contextvars.copy_context().run(one_cell, srv.base_url) for _ in range(3)]
        gc.collect()
        deadline = time.monotonic() + 10
        while loop_threads() - before and time.monotonic() < deadline:  # finalizers stop the loops
            time.sleep(0.01)
        assert [cell() for cell in cells] == [None, None, None]
        assert not loop_threads() - before  # none of this test's clients' loops is left


def test_a_client_finalized_on_its_own_loop_thread_closes_its_connections_without_waiting_for_itself():
    """The collector can run a client's finalizer on any thread, its own loop's included (seen in the
    full suite). Stopping there must not wait on the loop it is running in (a 10 s stall, then
    "cannot join current thread" raised inside the loop)."""
    with TestServer() as srv:
        client = ModelClient("test-model", srv.base_url)
        client.complete(word_sorting(0))
        engine = client._engine
        raised: list[dict] = []
        engine.loop.set_exception_handler(lambda loop, context: raised.append(context))
        assert engine.http is not None
        engine.loop.call_soon_threadsafe(engine.stop)  # as a finalizer run on the loop's thread
        engine.thread.join(timeout=30)
        assert not engine.thread.is_alive()
        assert raised == []
        assert engine.http is None and engine.loop.is_closed()


def test_async_api_can_be_used_directly():
    with TestServer() as srv:
        client = ModelClient("test-model", srv.base_url)

        async def main():
            try:
                return await asyncio.gather(*(client.acomplete(word_sorting(i)) for i in range(5)))
            finally:
                await client.aclose()

        responses = asyncio.run(main())
    assert [r.source for r in responses] == ["endpoint"] * 5


# -- retries and accounting ----------------------------------------------------------------------
def run_with_faults(seed: int) -> tuple[list, object, object]:
    requests = [word_sorting(i) for i in range(40)]
    with TestServer(error_rate=0.25, rate_429=0.25, seed=seed) as srv:
        client = ModelClient("test-model", srv.base_url, max_retries=30, **FAST)
        responses = client.complete_many(requests)
        return responses, client.usage.channel("worker-optimisation"), srv.stats


def test_retries_on_injected_429_and_500_keep_accounting_exact():
    responses, usage, stats = run_with_faults(seed=7)
    assert stats.http_429 > 0 and stats.http_500 > 0  # faults really happened
    # Every HTTP request the server saw is accounted for, failed or not.
    assert usage.http_attempts == stats.calls
    assert usage.retries == stats.http_429 + stats.http_500 == sum(r.retries for r in responses)
    # Tokens are counted once per successful call, never for a failed attempt.
    assert usage.endpoint_calls == stats.ok == 40 and usage.requests == 40
    assert usage.prompt_tokens == stats.prompt_tokens == sum(r.prompt_tokens for r in responses)
    assert usage.completion_tokens == stats.completion_tokens
    assert all(r.completion_tokens == count_tokens(r.text) for r in responses)
    assert usage.failures == 0 and usage.cache_hits == 0


def test_injected_faults_are_reproducible_for_a_seed():
    first, _, stats_a = run_with_faults(seed=7)
    second, _, stats_b = run_with_faults(seed=7)
    assert replace(stats_a, max_in_flight=0) == replace(stats_b, max_in_flight=0)  # timing aside
    assert [r.retries for r in first] == [r.retries for r in second]
    assert [r.text for r in first] == [r.text for r in second]


def test_a_request_failing_after_retries_loses_none_of_the_others(tmp_path):
    requests = [word_sorting(i) for i in range(30)]
    with TestServer(error_rate=0.5, seed=3) as srv:
        client = ModelClient("test-model", srv.base_url, max_retries=1,
                             cache=ResponseCache(tmp_path), **FAST)
        with pytest.raises(BatchError, match="failed after 2 attempts") as err:
            client.complete_many(requests)
        results = err.value.results
        failed = [i for i, r in enumerate(results) if isinstance(r, ModelError)]
        answered = [i for i, r in enumerate(results) if not isinstance(r, ModelError)]
        assert failed and answered and sorted(err.value.failures) == failed
        assert all(results[i].status == 500 and results[i].attempts == 2 for i in failed)
        usage = client.usage.total()
        assert usage.failures == len(failed) and usage.endpoint_calls == len(answered)
        # The answered ones were kept: asking again costs endpoint calls only for the failed.
        calls_before = srv.stats.calls
        again = client.complete_many([requests[i] for i in answered])
        assert srv.stats.calls == calls_before
        assert [r.text for r in again] == [results[i].text for i in answered]
        # return_exceptions gives the same picture without raising.
        mixed = client.complete_many(requests, return_exceptions=True)
        assert len(mixed) == 30 and all(not isinstance(mixed[i], ModelError) for i in answered)


def test_timeouts_are_retried_and_counted():
    requests = [word_sorting(i) for i in range(8)]
    with TestServer(stall_rate=0.4, stall_seconds=3.0, seed=1) as srv:
        client = ModelClient("test-model", srv.base_url, timeout=0.3, max_retries=10, **FAST)
        responses = client.complete_many(requests)
        stats = srv.stats
    usage = client.usage.total()
    assert stats.stalls > 0
    assert usage.retries == stats.stalls and usage.endpoint_calls == 8
    assert [r.text for r in responses] == [reply_for(list(q.messages)) for q in requests]


def test_unreachable_endpoint_is_a_clear_connection_error():
    # a port that refuses: bound, never listening, and kept (closed, another process's server could take it)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        client = ModelClient("m", f"http://127.0.0.1:{sock.getsockname()[1]}/v1", max_retries=2, **FAST)
        with pytest.raises(ModelError, match="after 3 attempts.*cannot reach") as err:
            client.complete(word_sorting(0))
    assert err.value.kind == "connection"
    usage = client.usage.total()
    assert (usage.http_attempts, usage.retries, usage.failures, usage.tokens) == (3, 2, 1, 0)


def test_backoff_is_exponential_with_jitter_and_honours_retry_after():
    rng = random.Random(0)
    for attempt in range(1, 8):
        d = min(4.0, 0.5 * 2 ** (attempt - 1))
        for _ in range(20):
            assert d / 2 <= backoff_delay(attempt, None, base=0.5, cap=4.0, rng=rng) <= d
    assert backoff_delay(1, "2.5", base=0.5, cap=4.0) == 2.5
    assert backoff_delay(1, "7200", base=0.5, cap=4.0) == 60.0
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= backoff_delay(1, later, base=0.5, cap=4.0) <= 31
    assert 0.25 <= backoff_delay(1, "soon", base=0.5, cap=4.0) <= 0.5


def test_the_client_waits_what_retry_after_says(monkeypatch):
    import heldout.models.client as client_module

    waits = []

    def spy(attempt, retry_after, **kw):  # observes the real rule, changes nothing
        waits.append((retry_after, backoff_delay(attempt, retry_after, **kw)))
        return waits[-1][1]

    monkeypatch.setattr(client_module, "backoff_delay", spy)
    with TestServer(rate_429=0.5, retry_after=0.05, seed=2) as srv:
        ModelClient("test-model", srv.base_url, max_retries=20, backoff_base=30.0).complete_many(
            [word_sorting(i) for i in range(10)])
        assert len(waits) == srv.stats.http_429 > 0
    assert set(waits) == {("0.05", 0.05)}  # not the 15-30 s its own backoff would have chosen


@pytest.mark.parametrize("body", [b"not json", b'{"choices": []}',
                                  b'{"choices": [{"message": {"content": null}}]}',
                                  b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "many"}}'])
def test_a_200_that_is_not_a_chat_completion_is_a_bad_response(body):
    with pytest.raises(ModelError) as err:
        _parse_completion(httpx.Response(200, content=body))
    assert err.value.kind == "bad_response"


def test_usage_is_booked_per_channel():
    with TestServer() as srv:
        client = ModelClient("test-model", srv.base_url)
        worker = word_sorting(0)
        architect = ChatRequest(worker.messages, worker.model, replicate=1, channel="architect")
        deployment = ChatRequest(worker.messages, worker.model, replicate=2, channel="worker-deployment")
        client.complete_many([worker, architect, deployment, word_sorting(1)])
    by_channel = client.usage.by_channel()
    assert by_channel["worker-optimisation"]["endpoint_calls"] == 2
    assert by_channel["architect"]["endpoint_calls"] == 1
    assert by_channel["worker-deployment"]["endpoint_calls"] == 1
    assert client.usage.total().tokens == sum(c["tokens"] for c in by_channel.values())


# -- connections ---------------------------------------------------------------------------------
class _OneShotServer(ScriptedSocketServer):
    """A loopback HTTP/1.1 endpoint that answers each request with a fixed chat completion, then
    either closes the connection at once (``Connection: close``) or keeps it alive and closes it
    silently ``idle_close`` seconds later (as servers drop idle connections). ``closed`` is
    released once per connection it closed."""

    BODY = (b'{"choices":[{"message":{"role":"assistant","content":"ok"}}],'
            b'"usage":{"prompt_tokens":1,"completion_tokens":1}}')

    def __init__(self, close_at_once: bool, idle_close: float = 0.05) -> None:
        self.close_at_once, self.idle_close = close_at_once, idle_close
        self.closed = threading.Semaphore(0)
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        try:
            self._answer_until_closed(conn)
        finally:
            self.closed.release()

    def _answer_until_closed(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            while read_request(reader) is not None:
                close = b"Connection: close\r\n" if self.close_at_once else b""
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + close +
                             b"Content-Length: %d\r\n\r\n" % len(self.BODY) + self.BODY)
                if self.close_at_once:
                    return
                conn.settimeout(self.idle_close)
                try:
                    if not reader.peek(1):
                        return
                except (TimeoutError, socket.timeout):
                    return  # idle too long: drop the connection without a word
                conn.settimeout(None)


def test_connections_are_kept_alive_and_never_more_than_the_calls_in_flight():
    requests = [word_sorting(i) for i in range(48)]
    with TestServer(latency=0.02) as srv:
        with ModelClient("test-model", srv.base_url, concurrency=4) as client:
            responses = client.complete_many(requests)
            opened = client._engine.http.opened
    assert [r.text for r in responses] == [reply_for(list(q.messages)) for q in requests]
    assert 1 < opened <= 4  # 48 calls over at most 4 connections, each reused


@pytest.mark.parametrize("close_at_once", [True, False], ids=["connection-close", "idle-connection-dropped"])
def test_a_connection_the_server_closed_is_replaced_without_a_retry(close_at_once):
    server = _OneShotServer(close_at_once)
    try:
        with ModelClient("test-model", server.base_url, concurrency=1, max_retries=0) as client:
            for i in range(3):
                assert client.complete(word_sorting(i)).text == "ok"
                # the server has closed it (at once, or once idle) before the next request: a fixed
                # pause past the idle close could end first on a loaded machine, and the request
                # then raced the close
                assert server.closed.acquire(timeout=30)
            usage = client.usage.total()
    finally:
        server.close()
    assert (usage.endpoint_calls, usage.retries, usage.failures) == (3, 0, 0)
    assert server.connections == 3


def test_a_proxy_in_the_environment_is_used_and_no_proxy_is_honoured(monkeypatch):
    # the proxy: a port that refuses, bound and never listening for the whole test (closed, it could
    # be taken meanwhile, by this test's own server among others)
    with socket.socket() as sock, TestServer() as srv:
        sock.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{sock.getsockname()[1]}"
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy)
        with ModelClient("test-model", srv.base_url, max_retries=0, **FAST) as client:
            with pytest.raises(ModelError) as err:  # sent to the (dead) proxy, not to the server
                client.complete(word_sorting(0))
        assert err.value.kind == "connection" and srv.stats.calls == 0
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        with ModelClient("test-model", srv.base_url, max_retries=0, **FAST) as client:
            assert client.complete(word_sorting(0)).text == reply_for(list(word_sorting(0).messages))
