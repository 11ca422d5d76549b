"""How often and how fast a :class:`~heldout.models.ModelClient` calls its endpoint: the retry
backoff (``Retry-After`` honoured) and the :class:`AdaptiveLimit` window learned from the endpoint."""

from __future__ import annotations

import asyncio
import collections
import email.utils
import random
import time


def parse_retry_after(header: str | None) -> float | None:
    """A ``Retry-After`` header (seconds or an HTTP date) in seconds, clamped to [0, 60]; None
    when absent or unreadable."""
    if not header:
        return None
    try:
        seconds = float(header)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(header).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), 60.0)


def backoff_delay(attempt: int, retry_after: str | None, *, base: float, cap: float,
                  rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based). A ``Retry-After`` header
    (seconds or an HTTP date) is honoured as given, up to 60 s; otherwise exponential backoff
    with equal jitter: uniform in [d/2, d] for d = min(cap, base * 2**(attempt-1))."""
    seconds = parse_retry_after(retry_after)
    if seconds is not None:
        return seconds
    d = min(cap, base * 2 ** (attempt - 1))
    return d / 2 + (rng or random).uniform(0, d / 2)


def retryable_status(status: int) -> bool:
    return status == 429 or status == 408 or status >= 500


class AdaptiveLimit:
    """How many endpoint calls may be in flight, learned from the endpoint (like TCP's window).

    Rule: start at ``initial`` and grow by one per success (slow start: doubling per round
    trip) up to ``ssthresh``, then by 1/window per success (additive increase), never past
    ``limit``. A 429 cuts the window to 0.7 of itself and sets ``ssthresh`` to it, once per round of requests
    (answers to requests sent before the last cut do not cut again), and a ``Retry-After`` holds
    every new call until it has passed. Calls are paced: successive starts are at least
    round-trip / window apart (round trip = moving average of successful calls), so a window's
    calls do not arrive as one burst at a rate limiter. Only used inside the client's event loop."""

    DECREASE = 0.7  # gentler than halving (as CUBIC): the window's sawtooth stays near the rate

    def __init__(self, limit: int, initial: int = 2) -> None:
        self.limit = limit
        self.window = float(min(initial, limit))
        self.ssthresh = float(limit)
        self.in_flight = 0
        self.epoch = 0               # bumped at every cut
        self.hold_until = 0.0        # loop time before which no new call starts
        self.round_trip = 0.0        # moving average of successful calls' seconds (0: unknown)
        self.next_start = 0.0        # loop time of the earliest next start (pacing)
        self._waiting: collections.deque[asyncio.Future] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None

    async def acquire(self) -> int:
        """Wait for a free place in the window (and the end of any hold or pacing gap), first
        come first served; returns the epoch the call starts in."""
        loop = asyncio.get_running_loop()
        turn = loop.create_future()
        self._waiting.append(turn)
        self._wake()
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # granted just as we were cancelled: give the place back
            else:
                self._waiting.remove(turn)
            raise
        return self.epoch

    def _wake(self) -> None:
        """Grant places to waiters in order while the window, hold and pacing allow; when only
        time stands in the way, come back then (one timer, not one per waiter)."""
        loop = asyncio.get_running_loop()
        while self._waiting and self.in_flight < int(self.window):
            now = loop.time()
            start_at = max(self.hold_until, self.next_start)
            if start_at > now:
                if self._timer is None or self._timer.when() > start_at:
                    if self._timer is not None:
                        self._timer.cancel()
                    self._timer = loop.call_at(start_at, self._on_timer)
                return
            turn = self._waiting.popleft()
            if turn.done():  # cancelled while waiting
                continue
            self.in_flight += 1
            self.next_start = now + self.round_trip / self.window
            turn.set_result(None)

    def _on_timer(self) -> None:
        self._timer = None
        self._wake()

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def succeeded(self, seconds: float | None = None) -> None:
        if seconds is not None:
            self.round_trip = seconds if self.round_trip == 0 else 0.875 * self.round_trip + 0.125 * seconds
        if self.window < self.ssthresh:
            self.window = min(self.limit, self.window + 1.0)
        else:
            self.window = min(self.limit, self.window + 1.0 / self.window)
        self._wake()

    def throttled(self, epoch: int, retry_after: float | None) -> None:
        loop = asyncio.get_running_loop()
        if retry_after is not None:
            self.hold_until = max(self.hold_until, loop.time() + retry_after)
        if epoch == self.epoch:  # first news of this round's overload
            self.epoch += 1
            self.window = max(1.0, self.window * self.DECREASE)
            self.ssthresh = self.window
        self._wake()
