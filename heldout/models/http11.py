"""Keep-alive HTTP/1.1 connections to one origin, on asyncio's protocol layer, with h11 (the HTTP/1.1
state machine httpx itself stands on) reading and writing the messages: the model client's own
transport when no proxy applies.

A metric call at zero latency costs the client its HTTP exchange and little else, so the exchange
is kept to what a JSON POST needs: the request goes out in one write, and the answer is handed to
h11 as its bytes arrive (a ``Content-Length`` body, a chunked one, or the bytes until the server
closes; an interim 100 is skipped). httpcore and anyio around h11 cost most of the client's CPU
per call (perf/protected_path.py: the bare client at 0 ms latency). Failures raise httpx's exception
classes, so the proxied path (an ``httpx.AsyncClient``) and this one fail alike: a refused or
timed-out connect is ``ConnectError``/``ConnectTimeout``, no byte of the answer for ``timeout``
seconds is ``ReadTimeout``, a server that hangs up before its answer is complete or sends what is
not HTTP/1.x is ``RemoteProtocolError``. A connection that failed, was cancelled mid-answer, holds
bytes past its answer or that the server asked to close is never reused. An answer's body is read
up to :data:`MAX_BODY_BYTES`.
"""

from __future__ import annotations

import asyncio
import collections
import json
import ssl
from typing import Any

import h11
import httpx

MAX_HEAD_BYTES = 64 << 10  # a status line and headers longer than this are not an answer
# an answer's body past this is no completion (one output is read up to 131,072 characters): a
# huge or endless body fails the request instead of filling the harness's memory
MAX_BODY_BYTES = 16 << 20


class Reply:
    """One answer: ``status_code``, ``headers`` (lower-cased names; a repeated header keeps its
    last value) and ``content``; ``text`` and ``json()`` as httpx's ``Response`` has them."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code, self.headers, self.content = status_code, headers, content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection, answering one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.waiter: asyncio.Future | None = None
        self.last_read = 0.0
        self.http = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.size = 0

    # -- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.abort()  # bytes nobody asked for: the connection no longer speaks our protocol
            return
        self.last_read = self.loop.time()
        self.http.receive_data(data)
        self._read()

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost settles the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is None or self.waiter.done():
            return
        if self.http.their_state is h11.SEND_BODY:
            self.http.receive_data(b"")  # the close ends a body delimited by it (else h11 refuses)
            self._read()
        if not self.waiter.done():
            self.waiter.set_exception(httpx.RemoteProtocolError(
                "server disconnected without sending a complete response" + (f" ({exc})" if exc else "")))

    # -- the answer ---------------------------------------------------------------------------------
    def _read(self) -> None:
        """Take h11's events as far as the bytes go; the answer's end settles the waiter."""
        try:
            while True:
                event = self.http.next_event()
                if event is h11.NEED_DATA:
                    return
                if type(event) is h11.Data:
                    self.chunks.append(event.data)
                    self.size += len(event.data)
                    if self.size > MAX_BODY_BYTES:
                        raise h11.RemoteProtocolError(f"an answer's body over {MAX_BODY_BYTES} bytes")
                elif type(event) is h11.Response:
                    self.status = event.status_code
                    self.headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers}
                    declared = self.headers.get("content-length", "0")
                    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
                        raise h11.RemoteProtocolError(f"an answer's body of {declared} bytes, over {MAX_BODY_BYTES}")
                elif type(event) is h11.EndOfMessage:
                    self._done()
                    return
                elif type(event) is h11.ConnectionClosed:
                    return  # connection_lost says it was incomplete
                # (an InformationalResponse, e.g. 100 Continue: the real answer follows)
        except h11.RemoteProtocolError as exc:
            self._fail(httpx.RemoteProtocolError(str(exc)))

    def _done(self) -> None:
        reply = Reply(self.status, self.headers, b"".join(self.chunks))
        self.chunks, self.size = [], 0
        # bytes past the answer belong to no request: the connection is not used again
        if self.http.their_state is h11.DONE and self.http.our_state is h11.DONE and not self.http.trailing_data[0]:
            self.http.start_next_cycle()
        else:
            self.abort()
        self.waiter.set_result(reply)  # type: ignore[union-attr]

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def timed_out(self, timeout: float) -> None:
        """The read timer: fails the answer once no byte has come for ``timeout`` seconds."""
        if self.waiter is None or self.waiter.done():
            return
        quiet = self.loop.time() - self.last_read
        if quiet < timeout:
            self.timer = self.loop.call_later(timeout - quiet, self.timed_out, timeout)
            return
        self._fail(httpx.ReadTimeout(f"no answer for {timeout:g} s"))

    async def exchange(self, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes, timeout: float) -> Reply:
        """Send one POST of ``body`` to ``target`` and wait for its answer."""
        http = self.http
        message = (http.send(h11.Request(method=b"POST", target=target,
                                         headers=[*headers, (b"Content-Length", b"%d" % len(body))]))
                   + http.send(h11.Data(data=body)) + http.send(h11.EndOfMessage()))
        self.waiter = self.loop.create_future()
        self.last_read = self.loop.time()
        self.transport.write(message)  # type: ignore[union-attr]
        self.timer = self.loop.call_later(timeout, self.timed_out, timeout)
        try:
            return await self.waiter
        except BaseException:
            self.abort()  # a failure or a cancellation mid-answer: its bytes may still come
            raise
        finally:
            self.timer.cancel()
            self.waiter = None


class Connections:
    """The keep-alive connections of one client to one origin (``http://`` or ``https://``), at
    most one request in flight on each; the callers bound how many requests are in flight, so
    there are never more connections than that. ``headers`` are sent with every request
    (``Host`` and ``Content-Length`` are added here)."""

    def __init__(self, url: str, headers: list[tuple[bytes, bytes]], timeout: float) -> None:
        target = httpx.URL(url)
        self.secure = target.scheme == "https"
        self.host = target.host
        self.port = target.port or (443 if self.secure else 80)
        self.ssl_context: ssl.SSLContext | None = httpx.create_ssl_context() if self.secure else None
        self.common = [(b"Host", target.netloc), *headers]
        for name, value in self.common:
            if any(c in value or c in name for c in (b"\r", b"\n", b"\0")):
                raise ValueError(f"header {name.decode('latin-1')} holds a line break or NUL")
        self.timeout = timeout
        self.targets: dict[str, bytes] = {}  # URL -> its path and query, as sent
        self.idle: collections.deque[_Connection] = collections.deque()
        self.opened = 0

    def _target(self, url: str) -> bytes:
        found = self.targets.get(url)
        if found is None:
            found = self.targets[url] = httpx.URL(url).raw_path
        return found

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop), self.host, self.port, ssl=self.ssl_context,
                    server_hostname=self.host if self.secure else None)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {self.host}:{self.port} within {self.timeout:g} s") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(str(exc)) from exc
        self.opened += 1
        return conn

    async def post(self, url: str, body: bytes) -> Reply:
        conn = None
        while self.idle and conn is None:
            conn = self.idle.pop()
            if conn.closed:
                conn = None
        if conn is None:
            conn = await self._open()
        reply = await conn.exchange(self._target(url), self.common, body, self.timeout)
        if not conn.closed:
            self.idle.append(conn)
        return reply

    async def aclose(self) -> None:
        while self.idle:
            self.idle.pop().abort()
