"""A loopback chat-completions server that enforces a request rate, for measuring and testing
adaptive concurrency (issue 19): a fixture of tests/test_models_adaptive.py and
perf/model_throughput.py, so it lives with them, not in the package. Kept apart from
:mod:`heldout.models.testserver`, whose answers it does not need: every accepted request gets the
same short completion after ``latency``.

Admission is a token bucket: ``rate`` requests per second with ``burst`` tokens of headroom. A
request that finds the bucket empty is answered at once with 429 and ``Retry-After`` = the time
until the next token (seconds, decimal), as a real rate-limited endpoint does.

    with RateLimitedServer(rate=100, burst=5, latency=0.05) as srv:
        client = ModelClient("m", base_url=srv.base_url, adaptive=True)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from heldout.models.server import send_json


@dataclass
class RateStats:
    accepted: int = 0
    rejected: int = 0
    first_accept: float | None = None
    last_accept: float | None = None
    max_in_flight: int = 0


class _Bucket:
    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = burst
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def take(self) -> float:
        """0.0 when admitted, else the seconds until a token will be there."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return 0.0
            return (1.0 - self.tokens) / self.rate


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        owner = self.server.owner
        wait = owner.bucket.take()
        if wait > 0:
            owner._count(rejected=True)
            self._send(429, {"error": {"message": "rate limited", "type": "rate_limit"}},
                       {"Retry-After": f"{wait:.3f}"})
            return
        owner._enter()
        try:
            time.sleep(owner.latency)
            self._send(200, {"choices": [{"message": {"role": "assistant", "content": "So the answer is A."}}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
        finally:
            owner._leave()

    def _send(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        send_json(self, status, body, headers)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    owner: "RateLimitedServer"


class RateLimitedServer:
    """``rate`` accepted requests per second (token bucket of ``burst``), ``latency`` seconds per
    accepted answer, 429 + Retry-After for the rest. ``stats`` counts both and the accept times."""

    def __init__(self, rate: float, burst: float = 1.0, latency: float = 0.0, port: int = 0) -> None:
        if rate <= 0 or burst < 1 or latency < 0:
            raise ValueError("rate must be > 0, burst >= 1, latency >= 0")
        self.bucket = _Bucket(rate, burst)
        self.latency = latency
        self.stats = RateStats()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.owner = self
        self._thread: threading.Thread | None = None

    def _count(self, rejected: bool) -> None:
        with self._lock:
            self.stats.rejected += rejected

    def _enter(self) -> None:
        now = time.monotonic()
        with self._lock:
            self.stats.accepted += 1
            self.stats.first_accept = now if self.stats.first_accept is None else self.stats.first_accept
            self.stats.last_accept = now
            self._in_flight += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "RateLimitedServer":
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "RateLimitedServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python tests/ratelimit_server.py --rate 40 --latency 0.1``: serve until killed,
    printing ``listening on URL`` first (so a measuring client need not share its interpreter)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--rate", type=float, required=True, help="accepted requests per second")
    parser.add_argument("--burst", type=float, default=1.0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per accepted answer")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with RateLimitedServer(args.rate, args.burst, args.latency, args.port) as server:
        print(f"listening on {server.base_url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
