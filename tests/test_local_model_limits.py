"""`heldout serve-model` with the real SmolLM2-135M model (llama.cpp, one slot) against what issue 55
found: bodies the OpenAI API refuses answered 200, one 20 MB chat holding the only slot while 7
of 8 good concurrent requests timed out, and one abandoned request holding it for 1,491 s.

Measured here: a client that hangs up mid-answer (streamed or not) frees the slot, so the next
client is served in a fraction of the time the abandoned answer would have taken; a body over the
cap is 413 and a prompt that cannot fit is 400 at once, even while the slot is busy. Skipped, with
the reason, when the [local-model] extra is not installed (CI installs it)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from heldout.models.backends.llama import LlamaBackend, resolve_model
from heldout.models.backends.pool import SlotPool
from heldout.models.server import ChatServer

from conftest import REPO_ROOT
from test_local_model import TIMEOUT, needs_model

MODEL = "smollm2-135m-instruct"
# with this seed the model writes ~670 tokens before it ends by itself: a long answer to abandon
LONG = {"model": MODEL, "prompt": "Once upon a time", "temperature": 1.0, "seed": 1, "max_tokens": 600}


@pytest.fixture(scope="module")
def pool():
    return SlotPool([LlamaBackend(resolve_model(MODEL), threads=1, n_ctx=2048, max_tokens_cap=600)])


@pytest.fixture(scope="module")
def server(pool):
    with ChatServer(pool, name="local-model") as srv:
        yield srv


def ask(server: ChatServer, max_tokens: int = 8) -> tuple[float, dict]:
    started = time.monotonic()
    reply = httpx.post(server.base_url + "/chat/completions", timeout=TIMEOUT,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}],
                             "max_tokens": max_tokens, "temperature": 0})
    assert reply.status_code == 200, reply.text
    return time.monotonic() - started, reply.json()


def tokens_per_second(server: ChatServer) -> float:
    """This machine's generation rate now (the suite shares the CPU), from a long-ish answer."""
    started = time.monotonic()
    reply = httpx.post(server.base_url + "/completions", timeout=TIMEOUT, json={**LONG, "max_tokens": 48})
    return reply.json()["usage"]["completion_tokens"] / (time.monotonic() - started)


def hang_up(port: int, *, stream: bool, after: float) -> None:
    data = json.dumps({**LONG, "stream": stream}).encode()
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(data) + data)
    if stream:
        conn.recv(1024)  # the answer has begun
    time.sleep(after)
    conn.close()


@needs_model
@pytest.mark.parametrize("stream", [False, True])
def test_a_hung_up_answer_stops_and_the_next_client_is_served_promptly(server, pool, stream):
    rate = tokens_per_second(server)
    would_take = LONG["max_tokens"] / rate  # the abandoned answer, had it run to its end
    answered, abandoned = sum(pool.answered), server.stats.abandoned
    hang_up(server.port, stream=stream, after=1.0)
    waited, _ = ask(server)
    # the server counts the abandoned answer after its slot is free: the next one can finish first
    deadline = time.monotonic() + 30
    while server.stats.abandoned != abandoned + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.stats.abandoned == abandoned + 1 and sum(pool.answered) == answered + 2
    # measured on 2 busy cores: ~36 s for the abandoned answer at ~17 tokens/s, ~1 s for the next
    assert waited < 0.25 * would_take, (f"the next client waited {waited:.1f} s; the abandoned answer would have "
                                        f"taken {would_take:.1f} s at {rate:.1f} tokens/s")


@needs_model
def test_a_body_over_the_cap_and_a_prompt_that_cannot_fit_are_refused_at_once_while_the_slot_is_busy(server):
    calls = server.stats.calls
    with ThreadPoolExecutor(1) as threads:
        busy = threads.submit(lambda: httpx.post(server.base_url + "/completions", timeout=TIMEOUT,
                                                 json={**LONG, "max_tokens": 96}))
        deadline = time.monotonic() + 30  # the long answer is in the server (a pause may be too short)
        while server.stats.calls == calls and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        huge = httpx.post(server.base_url + "/chat/completions", timeout=TIMEOUT, json={
            "model": MODEL, "messages": [{"role": "user", "content": "x" * (20 << 20)}]})
        cannot_fit = httpx.post(server.base_url + "/chat/completions", timeout=TIMEOUT, json={
            "model": MODEL, "messages": [{"role": "user", "content": "word " * 20_000}]})  # 100 kB < the 1 MiB cap
        refused_in = time.monotonic() - started
        assert busy.result().status_code == 200
    assert huge.status_code == 413 and cannot_fit.status_code == 400
    assert "more than the model's context of 2048 tokens can hold" in cannot_fit.json()["error"]["message"]
    assert refused_in < 5.0  # neither waited for the slot, nor tokenized 100 kB inside it


@needs_model
@pytest.mark.parametrize("bad", [{"max_tokens": -7}, {"max_tokens": 10 ** 400}, {"n": 1000}, {"best_of": 10 ** 9},
                                 {"temperature": 9}, {"messages": [{"role": "wizard", "content": "hi"}]}])
def test_the_real_model_server_refuses_what_the_openai_api_refuses(server, bad):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **bad}
    reply = httpx.post(server.base_url + "/chat/completions", content=json.dumps(body), timeout=TIMEOUT)
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error", reply.text


@needs_model
def test_serve_model_answers_eight_good_requests_beside_a_20_mb_one_and_a_hung_up_one():
    """The issue's scenario through the command itself: one slot, a 20 MB chat, a client that hangs
    up mid-answer, and 8 good concurrent requests that must all be answered."""
    proc = subprocess.Popen([sys.executable, "-m", "heldout.cli", "serve-model", "--port", "0", "--threads", "1",
                             "--max-tokens", "600"], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        base_url = re.search(r"(http://127\.0\.0\.1:\d+/v1)", proc.stdout.readline()).group(1)
        port = int(base_url.rsplit(":", 1)[1].split("/")[0])
        huge = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * (20 << 20)}]}).encode()

        def good(i: int) -> int:
            return httpx.post(base_url + "/chat/completions", timeout=60, json={
                "model": MODEL, "messages": [{"role": "user", "content": f"Say the number {i}."}],
                "max_tokens": 8, "temperature": 0}).status_code

        with ThreadPoolExecutor(10) as threads:
            gone = threads.submit(hang_up, port, stream=False, after=1.0)
            big = threads.submit(lambda: httpx.post(base_url + "/chat/completions", content=huge, timeout=60))
            time.sleep(0.2)
            statuses = list(threads.map(good, range(8)))
            gone.result()
            assert big.result().status_code == 413
        assert statuses == [200] * 8
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "served 8 of 10 calls" in err, err
