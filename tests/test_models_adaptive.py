"""Adaptive concurrency (issue 19): the client learns an endpoint's rate instead of hammering it.
Rules of :class:`AdaptiveLimit` step by step, then a real client against a real loopback server
that rate-limits with 429 + Retry-After: every call answered, none failed."""

from __future__ import annotations

import asyncio

from heldout.models import ChatRequest, ModelClient
from heldout.models.pacing import AdaptiveLimit, parse_retry_after
from ratelimit_server import RateLimitedServer  # tests/, on the path


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def test_slow_start_doubles_per_round_then_grows_by_one_per_window():
    async def scenario():
        limit = AdaptiveLimit(16)
        assert limit.window == 2
        for _ in range(2):
            limit.succeeded()
        assert limit.window == 4          # one round of 2 successes doubled it
        limit.throttled(limit.epoch, None)
        cut = 4 * AdaptiveLimit.DECREASE
        assert limit.window == limit.ssthresh == cut
        for _ in range(3):
            limit.succeeded()
        assert cut + 0.9 < limit.window < cut + 1.0  # above ssthresh: about one more per window of successes
        for _ in range(500):
            limit.succeeded()
        assert limit.window == 16         # recovered, never past the ceiling
    run(scenario())


def test_a_burst_of_429s_from_one_round_cuts_once_to_seven_tenths():
    async def scenario():
        limit = AdaptiveLimit(16, initial=16)
        epoch = limit.epoch
        for _ in range(10):               # ten answers to requests sent in the same round
            limit.throttled(epoch, None)
        assert limit.window == 16 * AdaptiveLimit.DECREASE
        limit.throttled(limit.epoch, None)  # news from the next round cuts again
        assert limit.window == 16 * AdaptiveLimit.DECREASE ** 2
    run(scenario())


def test_retry_after_holds_every_new_call_and_the_window_bounds_the_rest():
    async def scenario():
        loop = asyncio.get_running_loop()
        limit = AdaptiveLimit(4, initial=4)
        limit.throttled(limit.epoch, 0.2)
        start = loop.time()
        await limit.acquire()
        assert loop.time() - start >= 0.19  # nobody started during the hold
        await limit.acquire()               # window is now int(2.8) = 2: a third waits for a release
        third = asyncio.ensure_future(limit.acquire())
        await asyncio.sleep(0.05)
        assert not third.done()
        limit.release()
        await asyncio.wait_for(third, 1)
    run(scenario())


def test_retry_after_is_read_as_seconds_or_a_date_and_clamped():
    assert parse_retry_after("0.25") == 0.25
    assert parse_retry_after("3600") == 60.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past


def requests(n: int) -> list[ChatRequest]:
    return [ChatRequest(messages=({"role": "user", "content": f"question {i}"},), model="m") for i in range(n)]


def test_an_adaptive_client_gets_every_answer_from_a_rate_limited_server():
    with RateLimitedServer(rate=40, burst=2, latency=0.02) as server:
        client = ModelClient("m", base_url=server.base_url, concurrency=16, adaptive=True, max_retries=8)
        with client:
            answers = client.complete_many(requests(120))
        usage = client.usage.total()
    assert len(answers) == 120 and all(a.text for a in answers)
    assert usage.failures == 0 and usage.endpoint_calls == 120
    assert server.stats.accepted == 120
    assert server.stats.rejected > 0 and usage.retries == server.stats.rejected  # it was throttled
    assert server.stats.max_in_flight <= 16


def test_a_fixed_client_without_retries_loses_calls_to_the_same_server():
    with RateLimitedServer(rate=40, burst=2, latency=0.02) as server:
        with ModelClient("m", base_url=server.base_url, concurrency=16, max_retries=0) as client:
            results = client.complete_many(requests(60), return_exceptions=True)
    assert any(not hasattr(r, "text") for r in results)  # the adversary: a limit the client ignores
