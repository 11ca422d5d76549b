"""Keep-alive HTTP/1.1 connections to one origin, on asyncio's protocol layer: the model client's
own transport when no proxy applies.

A metric call at zero latency costs the client its HTTP exchange and little else, so the exchange
is kept to what a JSON POST needs: the request's head is bytes prepared once per URL (only its
``Content-Length`` varies) and goes out with its body in one write; the answer is parsed from
the bytes as they arrive (a status line, headers, then a ``Content-Length`` body, a chunked body
or, without either, the bytes until the server closes). httpcore, h11 and anyio did the same
through thousands of Python calls per request (perf/protected_path.py: the bare client's CPU per
call at 0 ms latency). Failures raise httpx's exception classes, so the proxied path (an
``httpx.AsyncClient``) and this one fail alike: a refused or timed-out connect is
``ConnectError``/``ConnectTimeout``, no byte of the answer for ``timeout`` seconds is
``ReadTimeout``, a server that hangs up before its answer is complete or sends what is not HTTP/1.x
is ``RemoteProtocolError``. A connection that failed, was cancelled mid-answer or that the server
asked to close is never reused.
"""

from __future__ import annotations

import asyncio
import collections
import json
import ssl
from typing import Any

import httpx

MAX_HEAD_BYTES = 64 << 10  # a status line and headers longer than this are not an answer


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


def _head(raw: bytes) -> tuple[int, dict[str, str], bool]:
    """(status, headers, keep-alive) of a response head (without its blank line)."""
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise httpx.RemoteProtocolError(f"malformed header line: {line[:100]!r}")
        key = name.decode("latin-1").lower()
        value_text = value.strip().decode("latin-1")
        if key == "content-length" and headers.get(key, value_text) != value_text:
            raise httpx.RemoteProtocolError("conflicting Content-Length headers")
        headers[key] = value_text
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection if parts[0] == b"HTTP/1.1" else "keep-alive" in connection
    return int(parts[1]), headers, keep


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection, answering one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.waiter: asyncio.Future | None = None
        self.buffer = bytearray()
        self.last_read = 0.0
        self._reset()

    def _reset(self) -> None:
        self.head: tuple[int, dict[str, str], bool] | None = None
        self.body_start = 0
        self.length: int | None = None  # the body's bytes; None: chunked or until the server closes
        self.chunked = False
        self.chunks: list[bytes] = []
        self.chunk_at = 0  # where the next chunk's size line starts in the buffer

    # -- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            self.abort()  # bytes nobody asked for: the connection no longer speaks our protocol
            return
        self.last_read = self.loop.time()
        self.buffer += data
        try:
            reply = self._parse()
        except httpx.RemoteProtocolError as exc:
            self._fail(exc)
            return
        if reply is not None:
            self.waiter.set_result(reply)

    def eof_received(self) -> bool:
        return False  # the transport closes; connection_lost settles the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.head is not None and self.length is None and not self.chunked:
            status, headers, _ = self.head  # a body delimited by the close: complete now
            waiter.set_result(Reply(status, headers, bytes(self.buffer[self.body_start:])))
        else:
            waiter.set_exception(httpx.RemoteProtocolError(
                "server disconnected without sending a complete response" + (f" ({exc})" if exc else "")))

    # -- the answer ---------------------------------------------------------------------------------
    def _parse(self) -> Reply | None:
        if self.head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    raise httpx.RemoteProtocolError(f"response head longer than {MAX_HEAD_BYTES} bytes")
                return None
            self.head = _head(bytes(self.buffer[:end]))
            self.body_start = self.chunk_at = end + 4
            status, headers, _ = self.head
            if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
                del self.buffer[:end + 4]
                self._reset()
                return self._parse()
            encoding = headers.get("transfer-encoding", "").lower()
            if encoding:
                if encoding != "chunked":
                    raise httpx.RemoteProtocolError(f"unsupported Transfer-Encoding {encoding!r}")
                self.chunked = True
            elif status in (204, 304):
                self.length = 0
            elif "content-length" in headers:
                text = headers["content-length"]
                if not text.isdigit():
                    raise httpx.RemoteProtocolError(f"bad Content-Length {text[:40]!r}")
                self.length = int(text)
        if self.chunked:
            return self._parse_chunks()
        if self.length is None or len(self.buffer) - self.body_start < self.length:
            return None
        if len(self.buffer) - self.body_start > self.length:
            raise httpx.RemoteProtocolError("more bytes than the response's Content-Length")
        return self._done(bytes(self.buffer[self.body_start:]))

    def _parse_chunks(self) -> Reply | None:
        buf = self.buffer
        while True:
            line_end = buf.find(b"\r\n", self.chunk_at)
            if line_end < 0:
                if len(buf) - self.chunk_at > 1024:
                    raise httpx.RemoteProtocolError("chunk size line too long")
                return None
            size_text = bytes(buf[self.chunk_at:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise httpx.RemoteProtocolError(f"bad chunk size {size_text[:40]!r}") from None
            if size == 0:  # the last chunk; then trailers (ignored) up to a blank line
                trailers_end = buf.find(b"\r\n\r\n", line_end)
                if buf[line_end:line_end + 4] == b"\r\n\r\n" or trailers_end >= 0:
                    end = line_end + 4 if buf[line_end:line_end + 4] == b"\r\n\r\n" else trailers_end + 4
                    if len(buf) > end:
                        raise httpx.RemoteProtocolError("bytes after the last chunk")
                    return self._done(b"".join(self.chunks))
                return None
            start = line_end + 2
            if len(buf) < start + size + 2:
                return None
            if buf[start + size:start + size + 2] != b"\r\n":
                raise httpx.RemoteProtocolError("chunk not followed by CRLF")
            self.chunks.append(bytes(buf[start:start + size]))
            self.chunk_at = start + size + 2

    def _done(self, content: bytes) -> Reply:
        status, headers, keep = self.head  # type: ignore[misc]
        self.buffer.clear()
        self._reset()
        if not keep:
            self.abort()
        return Reply(status, headers, content)

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

    async def exchange(self, message: bytes, timeout: float) -> Reply:
        """Send one request (head and body in ``message``) and wait for its answer."""
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
        common = [(b"Host", target.netloc), *headers]
        for name, value in common:
            if any(c in value or c in name for c in (b"\r", b"\n", b"\0")):
                raise ValueError(f"header {name.decode('latin-1')} holds a line break or NUL")
        self.common = b"".join(name + b": " + value + b"\r\n" for name, value in common)
        self.timeout = timeout
        self.prefixes: dict[str, bytes] = {}  # URL -> the request head up to Content-Length's value
        self.idle: collections.deque[_Connection] = collections.deque()
        self.opened = 0

    def _prefix(self, url: str) -> bytes:
        found = self.prefixes.get(url)
        if found is None:
            path = httpx.URL(url).raw_path
            found = self.prefixes[url] = b"POST " + path + b" HTTP/1.1\r\n" + self.common + b"Content-Length: "
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
        reply = await conn.exchange(self._prefix(url) + b"%d\r\n\r\n" % len(body) + body, self.timeout)
        if not conn.closed:
            self.idle.append(conn)
        return reply

    async def aclose(self) -> None:
        while self.idle:
            self.idle.pop().abort()
