"""The loopback test server: :class:`~heldout.models.server.ChatServer` with the deterministic
backend (:mod:`heldout.models.backends.deterministic`), for tests and demos.

Answers are deterministic functions of the request body (see the backend). Fault injection (429,
500, stalls) is seeded and decided per (request body, how often that body was seen), so the same
test makes the same faults whatever order concurrent requests arrive in.

    with TestServer(latency=0.1, error_rate=0.0, rate_429=0.0, seed=0) as srv:
        client = ModelClient("test-model", base_url=srv.base_url)

    python -m heldout.models.testserver --port 8000 --latency 0.1
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Callable

from heldout.models.backends.deterministic import (DeterministicBackend, count_tokens, instruction_of,
                                                   options_in, reply_for, skill_of, solve)
from heldout.models.server import LOOPBACK_HOSTS, ChatCall, ChatServer, Completion, FaultPlan, ServerStats

__all__ = ["LOOPBACK_HOSTS", "RecordingBackend", "ServerStats", "TestServer", "count_tokens", "instruction_of",
           "main", "options_in", "reply_for", "skill_of", "solve"]


class RecordingBackend(DeterministicBackend):
    """The test double's model, keeping every :class:`ChatCall` the server handed it in
    ``calls`` (in arrival order), so a test can assert on the server side what was sent: the
    endpoint, the bytes, the stop sequences and the decoding."""

    def __init__(self, run_on: str = "") -> None:
        super().__init__(run_on)
        self.calls: list[ChatCall] = []
        self._lock = threading.Lock()

    def complete(self, call: ChatCall, on_text: Callable[[str], None] | None = None) -> Completion:
        with self._lock:
            self.calls.append(call)
        return super().complete(call, on_text)


class TestServer(ChatServer):
    """The test double for a model endpoint. ``base_url`` ends in ``/v1``; the port is chosen by
    the OS unless given. Faults: ``rate_429`` and ``error_rate`` (500) answer at once;
    ``stall_rate`` holds the request ``stall_seconds`` before answering (to exercise client
    timeouts). ``latency`` delays every successful answer."""

    __test__ = False  # not a pytest test class

    def __init__(self, latency: float = 0.0, error_rate: float = 0.0, rate_429: float = 0.0,
                 seed: int = 0, *, stall_rate: float = 0.0, stall_seconds: float = 5.0,
                 retry_after: float | None = None, api_key: str | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        faults = FaultPlan(error_rate=error_rate, rate_429=rate_429, stall_rate=stall_rate, seed=seed,
                           stall_seconds=stall_seconds, retry_after=retry_after)
        super().__init__(DeterministicBackend(), api_key=api_key, faults=faults, latency=latency,
                         host=host, port=port, name="test")
        self.error_rate, self.rate_429, self.seed = error_rate, rate_429, seed
        self.stall_rate, self.stall_seconds, self.retry_after = stall_rate, stall_seconds, retry_after


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m heldout.models.testserver",
                                     description="OpenAI-compatible test double on loopback.")
    parser.add_argument("--host", default="127.0.0.1", choices=LOOPBACK_HOSTS)
    parser.add_argument("--port", type=int, default=0, help="0: let the OS choose (printed)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per answer")
    parser.add_argument("--error-rate", type=float, default=0.0, help="share of injected 500s")
    parser.add_argument("--rate-429", type=float, default=0.0, help="share of injected 429s")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    args = parser.parse_args(argv)
    server = TestServer(latency=args.latency, error_rate=args.error_rate, rate_429=args.rate_429,
                        seed=args.seed, api_key=args.api_key, host=args.host, port=args.port)
    stats = server.serve_until_signalled("heldout test server listening on {url}")
    print(f"served {stats.ok} of {stats.calls} calls", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
