"""Response cache and record/replay: what is paid for once is never paid for again, and a
recording answers a run again with zero endpoint calls."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given, settings, strategies as st

from heldout.models import (
    BatchError,
    CacheError,
    ChatRequest,
    ModelClient,
    Recorder,
    Replay,
    ReplayError,
    ReplayMiss,
    ResponseCache,
    read_recording,
)
from heldout.models.types import ChatResponse
from heldout.models.testserver import TestServer, reply_for

FAST = {"backoff_base": 0.001, "backoff_cap": 0.01}


def question(i: int, replicate: int = 0, temperature: float = 0.0) -> ChatRequest:
    return ChatRequest(
        messages=({"role": "system", "content": "Answer with the right option."},
                  {"role": "user", "content": f"Item {i}: is {i} even?\nOptions:\n- Yes\n- No"}),
        model="test-model", replicate=replicate, temperature=temperature)


# -- cache ---------------------------------------------------------------------------------------
def test_cache_hits_cost_no_endpoint_call_even_from_a_new_client(tmp_path):
    requests = [question(i) for i in range(10)]
    with TestServer() as srv:
        first = ModelClient("test-model", srv.base_url, cache=ResponseCache(tmp_path / "c"))
        paid = first.complete_many(requests)
        assert srv.stats.calls == 10
        # A fresh client and a fresh cache object on the same directory (as a new process would).
        second = ModelClient("test-model", srv.base_url, cache=ResponseCache(tmp_path / "c"))
        served = second.complete_many(requests)
        assert srv.stats.calls == 10
    assert [r.text for r in served] == [r.text for r in paid]
    assert all(r.cached and r.source == "cache" for r in served)
    assert not any(r.cached for r in paid)
    usage = second.usage.total()
    assert (usage.requests, usage.cache_hits, usage.endpoint_calls, usage.tokens) == (10, 10, 0, 0)
    assert usage.served_prompt_tokens == sum(r.prompt_tokens for r in paid)


def test_identical_requests_in_one_batch_share_one_endpoint_call(tmp_path):
    with TestServer(latency=0.05) as srv:
        client = ModelClient("test-model", srv.base_url, cache=ResponseCache(tmp_path))
        responses = client.complete_many([question(1)] * 5 + [question(2)])
        assert srv.stats.calls == 2
    assert len({r.text for r in responses[:5]}) == 1
    usage = client.usage.total()
    assert (usage.requests, usage.endpoint_calls, usage.cache_hits) == (6, 2, 4)


def test_replicate_index_keeps_samples_distinct(tmp_path):
    cache = ResponseCache(tmp_path)
    samples = [question(1, replicate=r, temperature=0.8) for r in range(3)]
    with TestServer() as srv:
        client = ModelClient("test-model", srv.base_url, cache=cache)
        client.complete_many(samples)
        assert srv.stats.calls == 3 and len(cache) == 3  # three samples, three entries
        client.complete_many(samples + [question(1, replicate=3, temperature=0.8)])
        assert srv.stats.calls == 4  # only the new replicate reached the endpoint
    assert len({s.cache_key() for s in samples}) == 3


def test_cache_is_safe_across_processes(tmp_path):
    # Two processes write 150 entries each into one cache, plus one key both write; then a third
    # view of the directory sees every entry, and the shared key holds one writer's whole answer.
    script = textwrap.dedent("""
        import sys
        from heldout.models import ChatRequest, ResponseCache
        from heldout.models.types import ChatResponse
        cache, who = ResponseCache(sys.argv[1]), sys.argv[2]
        def put(name):
            req = ChatRequest([{"role": "user", "content": name}], "m")
            cache.put(req.cache_key(), req, ChatResponse("from " + who, 1, 2, False, 0.0, req.cache_key()))
        for i in range(150):
            put(f"{who}-{i}")
        put("shared")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), who]) for who in "ab"]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    cache = ResponseCache(tmp_path)
    assert len(cache) == 301
    shared = ChatRequest([{"role": "user", "content": "shared"}], "m").cache_key()
    assert cache.get(shared).text in ("from a", "from b")


def test_a_file_that_is_not_a_cache_is_a_clear_error(tmp_path):
    (tmp_path / ResponseCache.FILENAME).write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(CacheError, match="not a usable response cache"):
        ResponseCache(tmp_path)


# -- record / replay -------------------------------------------------------------------------------
def test_replay_reproduces_a_run_with_zero_endpoint_calls(tmp_path, monkeypatch):
    recording = tmp_path / "run" / "model_calls.jsonl"
    requests = [question(i) for i in range(20)] + [question(3, replicate=1, temperature=0.5)]
    with TestServer(error_rate=0.2, rate_429=0.2, seed=5) as srv:
        with Recorder(recording) as recorder:
            recorded = ModelClient("test-model", srv.base_url, recorder=recorder,
                                   max_retries=30, **FAST).complete_many(requests)
        calls = srv.stats.calls
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
        replayer = ModelClient("test-model", replay=Replay(recording))  # no endpoint at all
        replayed = replayer.complete_many(requests)
        assert srv.stats.calls == calls
    assert [(r.text, r.prompt_tokens, r.completion_tokens) for r in replayed] == \
        [(r.text, r.prompt_tokens, r.completion_tokens) for r in recorded]
    assert all(r.source == "replay" for r in replayed)
    usage = replayer.usage.total()
    assert (usage.replay_hits, usage.endpoint_calls, usage.http_attempts) == (21, 0, 0)


def test_a_request_missing_from_the_recording_is_a_clear_error(tmp_path):
    recording = tmp_path / "calls.jsonl"
    with TestServer() as srv, Recorder(recording) as recorder:
        ModelClient("test-model", srv.base_url, recorder=recorder).complete_many([question(1)])
    client = ModelClient("test-model", replay=Replay(recording))
    with pytest.raises(ReplayMiss, match="not in recording.*no endpoint calls"):
        client.complete(question(2))
    with pytest.raises(BatchError) as err:
        client.complete_many([question(1), question(1, replicate=1)])
    assert err.value.results[0].source == "replay" and err.value.failures[1].kind == "replay_miss"


def test_replay_can_be_recorded_again(tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    with TestServer() as srv, Recorder(first) as recorder:
        ModelClient("test-model", srv.base_url, recorder=recorder).complete_many([question(1)])
    with Recorder(second) as recorder:
        ModelClient("test-model", replay=Replay(first), recorder=recorder).complete_many([question(1)])
    assert [e["response"] for e in read_recording(second)] == [e["response"] for e in read_recording(first)]


def make_recording(tmp_path, n: int = 6):
    path = tmp_path / "calls.jsonl"
    with TestServer() as srv, Recorder(path) as recorder:
        ModelClient("test-model", srv.base_url, recorder=recorder).complete_many(
            [question(i) for i in range(n)])
    return path


@pytest.fixture(scope="module")
def recorded_bytes(tmp_path_factory) -> bytes:
    return make_recording(tmp_path_factory.mktemp("recording")).read_bytes()


@settings(max_examples=40, deadline=None)
@given(cut=st.floats(min_value=0.0, max_value=1.0))
def test_a_recording_cut_anywhere_reads_up_to_its_last_full_line(tmp_path_factory, recorded_bytes, cut):
    path = tmp_path_factory.mktemp("cut") / "calls.jsonl"
    data = recorded_bytes
    keep = int(len(data) * cut)
    path.write_bytes(data[:keep])  # what a process killed mid-write leaves
    lines = data.split(b"\n")
    full_lines = data[:keep].count(b"\n")
    tail = data[:keep].rsplit(b"\n", 1)[-1]
    # A last line that lost only its newline is whole, and is kept; any shorter piece is dropped.
    expected = full_lines + (1 if tail and tail == lines[full_lines] else 0)
    entries = read_recording(path)
    assert len(entries) == expected == len(Replay(path))
    originals = [json.loads(line)["key"] for line in lines[:expected]]
    assert [e["key"] for e in entries] == originals


def test_a_recording_process_killed_mid_run_leaves_a_replayable_file(tmp_path):
    path = tmp_path / "calls.jsonl"
    script = textwrap.dedent("""
        import sys
        from heldout.models import ChatRequest, ModelClient, Recorder
        requests = [ChatRequest([{"role": "user", "content": f"Is {i} even?"}], "test-model")
                    for i in range(400)]
        with Recorder(sys.argv[2]) as recorder:
            ModelClient("test-model", sys.argv[1], concurrency=4, recorder=recorder).complete_many(requests)
    """)
    # 400 answers at 0.1 s, 4 at a time, take 10 s: the kill after the 20th comes long before the
    # last even when the test's own process waits its turn on a loaded machine
    with TestServer(latency=0.1) as srv:
        proc = subprocess.Popen([sys.executable, "-c", script, srv.base_url, str(path)])
        try:
            deadline = time.monotonic() + 60
            while (not path.exists() or path.read_bytes().count(b"\n") < 20) and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            proc.kill()  # SIGKILL: no cleanup, no final flush
            proc.wait(timeout=10)
        assert proc.returncode == -9
        entries = read_recording(path)
        assert 20 <= len(entries) < 400
        # Every surviving line replays exactly what the server answered.
        replayed = ModelClient("test-model", replay=Replay(path)).complete_many(
            [e["request"] for e in entries])
        assert [r.text for r in replayed] == [
            reply_for(list(e["request"].messages)) for e in entries]
        # Resuming appends after the surviving lines.
        with Recorder(path) as recorder:
            ModelClient("test-model", srv.base_url, recorder=recorder).complete_many([question(1)])
    assert len(read_recording(path)) == len(entries) + 1


def test_recorder_reopened_on_a_torn_file_drops_the_torn_line_and_appends(tmp_path):
    path = make_recording(tmp_path, n=3)
    data = path.read_bytes()
    path.write_bytes(data + data.splitlines(keepends=True)[0][:40])  # torn 4th line
    with TestServer() as srv, Recorder(path) as recorder:
        ModelClient("test-model", srv.base_url, recorder=recorder).complete_many([question(9)])
    entries = read_recording(path)
    assert len(entries) == 4 and path.read_bytes().startswith(data)
    assert entries[-1]["request"] == question(9)


def test_a_corrupt_line_before_the_end_is_refused_with_its_line_number(tmp_path):
    path = make_recording(tmp_path, n=3)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "{garbage\n" + "".join(lines[1:]))
    with pytest.raises(ReplayError, match="line 2 .*corrupt"):
        Replay(path)


def test_an_edited_request_in_a_recording_is_detected(tmp_path):
    path = make_recording(tmp_path, n=3)
    lines = path.read_text().splitlines(keepends=True)
    entry = json.loads(lines[1])
    entry["request"]["messages"][1]["content"] = "Item 1: is 1 odd?"
    lines[1] = json.dumps(entry) + "\n"
    path.write_text("".join(lines))
    with pytest.raises(ReplayError, match="line 2: recorded key does not match"):
        Replay(path)


def test_a_missing_recording_is_a_clear_error(tmp_path):
    with pytest.raises(ReplayError, match="no recording at"):
        Replay(tmp_path / "nope.jsonl")


def test_recorder_keeps_response_source_and_tokens(tmp_path):
    path = tmp_path / "r.jsonl"
    request = question(1)
    with Recorder(path) as recorder:
        recorder.write(request, ChatResponse("So the answer is Yes.", 7, 5, True, 0.0,
                                             request.cache_key(), source="cache"))
    [entry] = read_recording(path)
    assert entry["source"] == "cache"
    assert (entry["response"].prompt_tokens, entry["response"].completion_tokens) == (7, 5)
