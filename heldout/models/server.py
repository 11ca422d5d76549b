"""One OpenAI-compatible server on loopback, in front of a pluggable backend.

The server owns the protocol: ``GET /v1/models``, ``POST /v1/chat/completions`` (messages in,
``choices[0].message.content`` out) and ``POST /v1/completions`` (a prompt string in,
``choices[0].text`` out), each as JSON or as server-sent events with ``"stream": true``;
``usage`` counts, ``finish_reason``, ``stop`` sequences, bearer-token checks, request validation
by the OpenAI API's own rules (:mod:`heldout.models.openai_rules`: a body it would refuse is a
400 JSON error naming the field, never a traceback), a cap on body size (413, read no further
than the cap), counters (:class:`ServerStats`) and, for tests, seeded fault injection
(:class:`FaultPlan`). A client that disconnects stops its answer: the server checks between
pieces of text (and while the request waits for a backend slot) whether its connection is
still open, and a backend stops generating when told (:class:`ClientGone`), freeing the slot. A :class:`Backend` only turns one validated
:class:`ChatCall` (a chat, or a completion's prompt) into a :class:`Completion`. Two backends exist:

* :class:`heldout.models.backends.deterministic.DeterministicBackend`, the test double behind
  :class:`heldout.models.testserver.TestServer`;
* :class:`heldout.models.backends.llama.LlamaBackend`, a real GGUF model through llama.cpp
  (``heldout serve-model``).

The server listens on loopback only: it is a local tool, never a public endpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import select
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Protocol

from heldout.models.openai_rules import ChatCall, RequestRefused, StopScanner, apply_stop, parse_call

__all__ = ["Backend", "BackendRefusal", "ChatCall", "ChatServer", "ClientGone", "Completion", "FaultPlan",
           "ServerStats", "StopScanner", "apply_stop", "send_json", "unit_interval"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_BODY_BYTES = 1 << 20  # 1 MiB: a whole 128k-token context of text; more is refused 413
DRAIN_BYTES = 64 << 20  # an oversized body up to this is read and dropped so its client sees the 413
BODY_SECONDS = 30.0  # the most a request body (or the drain of an oversized one) may take to arrive
GONE_CHECK_SECONDS = 0.1  # how often a request's connection is checked while its answer is made


def unit_interval(*parts: object) -> float:
    """A reproducible number in [0, 1) from the parts' text."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


# -- what a backend sees and returns -----------------------------------------------------------------
@dataclass(frozen=True)
class Completion:
    """A backend's answer. ``finish_reason`` is ``"stop"`` (the model ended) or ``"length"``
    (``max_tokens`` or the context ran out)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"


class BackendRefusal(Exception):
    """A request the backend cannot serve as asked (e.g. a prompt longer than its context);
    answered 400 with this message."""


class ClientGone(Exception):
    """Raised by the server's ``on_text`` when the request's client has disconnected: the backend
    lets it through (releasing its slot and model), and nothing more is generated for it."""


class Backend(Protocol):
    """Turns a call (a chat, or a completion's prompt: see :class:`ChatCall`) into a completion.
    ``on_text``, when given, receives the text as it is produced, in pieces whose concatenation
    is ``Completion.text`` (for streaming); the server always gives one, and it raises
    :class:`ClientGone` once the client has disconnected. A backend that works for long calls it
    between tokens, with ``""`` when it has no text ready (``on_text("")`` only asks whether the
    answer is still wanted), and lets the exception through. Must be safe to call from several
    threads (serialise inside if the model holds state). ``model_id`` is listed by
    ``/v1/models``; ``reported_model`` names the model in each answer."""

    model_id: str

    def reported_model(self, requested: str) -> str:
        ...

    # Optional: ``serves(name) -> bool``. A backend that has it is asked about every request's
    # model name, and a name it does not serve is answered 404 ``model_not_found``.

    def complete(self, call: ChatCall, on_text: Callable[[str], None] | None = None) -> Completion:
        ...


# -- counters and faults -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerStats:
    """What the server saw. ``calls`` counts every chat or completions request; ``ok`` those
    answered 200; ``max_in_flight`` the most requests it held at once."""

    calls: int = 0
    ok: int = 0
    http_429: int = 0
    http_500: int = 0
    stalls: int = 0
    bad_requests: int = 0
    too_large: int = 0  # bodies over the cap, answered 413
    abandoned: int = 0  # answers stopped because their client disconnected
    unauthorized: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_in_flight: int = 0


@dataclass
class FaultPlan:
    """Seeded fault injection for tests: a share ``rate_429`` of requests answered 429, a share
    ``error_rate`` answered 500, a share ``stall_rate`` held ``stall_seconds`` before answering.
    The decision is a function of (seed, request body, how often that body was seen), so the same
    test makes the same faults whatever order concurrent requests arrive in."""

    error_rate: float = 0.0
    rate_429: float = 0.0
    stall_rate: float = 0.0
    seed: int = 0
    stall_seconds: float = 5.0
    retry_after: float | None = None
    _seen: dict[str, int] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        for name, rate in (("error_rate", self.error_rate), ("rate_429", self.rate_429),
                           ("stall_rate", self.stall_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate}")
        if self.error_rate + self.rate_429 + self.stall_rate > 1.0:
            raise ValueError("error_rate + rate_429 + stall_rate must not exceed 1")

    def decide(self, raw: bytes) -> str | None:
        """``"429"``, ``"500"``, ``"stall"`` or None for this sighting of this body."""
        body_hash = hashlib.sha256(raw).hexdigest()
        with self._lock:
            nth = self._seen.get(body_hash, 0)
            self._seen[body_hash] = nth + 1
        u = unit_interval("fault", self.seed, body_hash, nth)
        if u < self.rate_429:
            return "429"
        if u < self.rate_429 + self.error_rate:
            return "500"
        if u < self.rate_429 + self.error_rate + self.stall_rate:
            return "stall"
        return None


# -- HTTP ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Reply:
    status: int
    body: dict[str, Any] | None = None  # None: the answer was streamed already
    headers: dict[str, str] = field(default_factory=dict)
    not_before: float = 0.0  # monotonic time before which the answer must not leave


@dataclass(frozen=True)
class Endpoint:
    """One route the server answers and the shape of its answers, as the OpenAI API has them:
    a chat answer's text is ``choices[0].message.content`` (streamed as ``delta.content``), a
    completion's is ``choices[0].text`` (streamed as ``text``)."""

    completion: bool
    object: str        # the answer's "object"
    chunk_object: str  # a streamed chunk's "object"
    id_prefix: str

    def choice(self, text: str, finish: str | None) -> dict[str, Any]:
        """The one choice of a whole answer."""
        if self.completion:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}

    def piece(self, text: str, finish: str | None, *, opening: bool = False) -> dict[str, Any]:
        """The one choice of a streamed chunk (a chat stream opens with the assistant's role)."""
        if self.completion:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        delta = {"role": "assistant", "content": text} if opening else ({"content": text} if text else {})
        return {"index": 0, "delta": delta, "finish_reason": finish}


CHAT_ENDPOINT = Endpoint(False, "chat.completion", "chat.completion.chunk", "chatcmpl-")
COMPLETIONS_ENDPOINT = Endpoint(True, "text_completion", "text_completion", "cmpl-")
ROUTES = {"/v1/chat/completions": CHAT_ENDPOINT, "/chat/completions": CHAT_ENDPOINT,
          "/v1/completions": COMPLETIONS_ENDPOINT, "/completions": COMPLETIONS_ENDPOINT}


def _error(status: int, message: str, kind: str, code: str | None = None, param: str | None = None) -> _Reply:
    """An OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return _Reply(status, {"error": {"message": message, "type": kind, "param": param, "code": code}})


def send_json(handler: BaseHTTPRequestHandler, status: int, body: dict,
              headers: dict[str, str] | None = None) -> None:
    """One JSON answer with its length; a client that already gave up (e.g. its timeout) is ignored."""
    data = json.dumps(body).encode("utf-8")
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so a client's connection pool is reused
    disable_nagle_algorithm = True  # else small header/body writes wait ~40 ms for delayed ACKs
    wbufsize = 1 << 16  # headers and body leave in one write (flushed after each request, and per event)
    server: "_HTTPServer"

    arrived = 0.0  # when the request line was read: an answer's latency counts from there

    def log_message(self, format: str, *args: Any) -> None:  # quiet: callers read stats
        pass

    def handle(self) -> None:  # a client that left before the last flush is no error to print
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    def finish(self) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().finish()

    def parse_request(self) -> bool:
        # stamped before the headers are parsed, so that the server's own reading and parsing is
        # inside the latency it promises, not added to it
        self.arrived = time.monotonic()
        return super().parse_request()

    def _send(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        send_json(self, status, body, headers)

    def start_events(self) -> None:
        """Headers of a server-sent-events answer; the connection closes after it (no length)."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()

    def send_event(self, payload: dict | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {data}\n\n".encode("utf-8"))
        self.wfile.flush()

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            model = self.server.owner.backend.model_id
            self._send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
        else:
            self._refuse(_error(404, f"no route {self.path}", "invalid_request_error"))

    def _refuse(self, reply: _Reply, *, close: bool = False) -> None:
        if close:
            self.close_connection = True
            reply = _Reply(reply.status, reply.body, {**reply.headers, "Connection": "close"})
        self._send(reply.status, reply.body, reply.headers)

    def _body(self) -> bytes | None:
        """The request body, read within :data:`BODY_SECONDS` and no further than the server's
        cap; None when it was refused here (400, 411 or 413, answered, connection closed)."""
        owner = self.server.owner
        if self.headers.get("Transfer-Encoding"):
            owner._count(calls=1, bad_requests=1)
            self._refuse(_error(411, "send the body with a Content-Length (chunked bodies are not read)",
                                "invalid_request_error"), close=True)
            return None
        declared = (self.headers.get("Content-Length") or "0").strip()
        if not declared.isdigit() or len(declared) > 19:
            owner._count(calls=1, bad_requests=1)
            self._refuse(_error(400, f"bad request: Content-Length {declared[:40]!r} is not a byte count",
                                "invalid_request_error"), close=True)
            return None
        length, deadline = int(declared), time.monotonic() + BODY_SECONDS
        if length > owner.max_body_bytes:
            owner._count(calls=1, too_large=1)
            if length <= DRAIN_BYTES:  # read and dropped, so the client is not reset mid-send and sees the 413
                self._read(length, deadline, keep=False)
            self._refuse(_error(413, f"the body is {length:,} bytes, over this server's limit of "
                                     f"{owner.max_body_bytes:,}", "invalid_request_error",
                                code="request_too_large"), close=True)
            return None
        raw = self._read(length, deadline, keep=True)
        if raw is None:
            self.close_connection = True  # the body did not arrive in time: nothing to answer
        return raw

    def _read(self, length: int, deadline: float, *, keep: bool) -> bytes | None:
        chunks, left = [], length
        try:
            while left > 0:
                self.connection.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    return None
                left -= len(chunk)
                if keep:
                    chunks.append(chunk)
        except OSError:  # a timeout, or the client went away
            return None
        finally:
            self.connection.settimeout(None)
        return b"".join(chunks)

    def client_gone(self) -> bool:
        """Whether the client closed (or reset) its connection. A request whose client waits has
        sent all it will send, so a readable socket with nothing to read is the end of it."""
        try:
            if not select.select([self.connection], [], [], 0)[0]:
                return False
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except (OSError, ValueError):  # reset, or already closed
            return True

    def do_POST(self) -> None:
        raw = self._body()
        if raw is None:
            return
        endpoint = ROUTES.get(self.path.rstrip("/"))
        if endpoint is None:
            self._refuse(_error(404, f"no route {self.path}", "invalid_request_error"))
            return
        owner = self.server.owner
        with owner._in_flight_slot():
            try:
                reply = owner._answer(raw, self.headers.get("Authorization"), self, endpoint)
            except (BrokenPipeError, ConnectionResetError, ClientGone):
                owner._count(abandoned=1)
                self.close_connection = True
                return  # the client went away mid-answer: nothing more is made for it
            if reply.body is not None:
                self._send(reply.status, reply.body, reply.headers)  # into the write buffer
                owner._wait_until(reply.not_before)  # it leaves when the request is done, not before


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    owner: "ChatServer"


class ChatServer:
    """An OpenAI-compatible endpoint for ``backend`` on loopback. ``base_url`` ends in ``/v1``;
    the port is chosen by the OS unless given. ``api_key`` (optional) is required as a bearer
    token; ``faults`` injects seeded 429/500/stalls; ``latency`` is every successful answer's time from arrival;
    ``max_body_bytes`` the largest body read (a larger one is answered 413).
    Use as a context manager, or ``start()``/``stop()``."""

    def __init__(self, backend: Backend, *, api_key: str | None = None, faults: FaultPlan | None = None,
                 latency: float = 0.0, host: str = "127.0.0.1", port: int = 0, name: str = "model",
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        if host not in LOOPBACK_HOSTS:
            raise ValueError(f"the {name} server listens on loopback only, not {host!r}")
        self.backend = backend
        self.max_body_bytes = max_body_bytes
        self.api_key = api_key
        self.faults = faults or FaultPlan()
        self.latency = latency
        self.host, self.port = host, port
        self.name = name
        self._lock = threading.Lock()
        self._stats: dict[str, int] = asdict(ServerStats())
        self._in_flight = 0
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "ChatServer":
        if self._httpd is not None:
            return self
        self._httpd = _HTTPServer((self.host, self.port), _Handler)
        self._httpd.owner = self
        self.port = self._httpd.server_address[1]
        self._stopping.clear()
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"heldout-{self.name}-server-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._stopping.set()  # wakes stalled handlers
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def stats(self) -> ServerStats:
        with self._lock:
            return ServerStats(**self._stats)

    def reset_stats(self) -> None:
        """Zero the counters (the fault plan keeps its memory of bodies already seen)."""
        with self._lock:
            self._stats = asdict(ServerStats())

    def serve_until_signalled(self, banner: str) -> ServerStats:
        """Serve in the foreground until SIGTERM or Ctrl-C; print ``banner`` (``{url}`` is
        replaced by the base URL) once listening. Returns the final counters."""
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            with self:
                print(banner.format(url=self.base_url), flush=True)
                try:
                    stop.wait()
                except KeyboardInterrupt:
                    pass
        finally:
            signal.signal(signal.SIGTERM, previous)
        return self.stats

    # -- request handling --------------------------------------------------------------------
    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._stats[name] += delta

    @contextlib.contextmanager
    def _in_flight_slot(self) -> Iterator[None]:
        with self._lock:
            self._in_flight += 1
            self._stats["calls"] += 1
            self._stats["max_in_flight"] = max(self._stats["max_in_flight"], self._in_flight)
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1

    def _answer(self, raw: bytes, authorization: str | None, handler: _Handler,
                endpoint: Endpoint = CHAT_ENDPOINT) -> _Reply:
        arrived = handler.arrived
        if self.api_key is not None and authorization != f"Bearer {self.api_key}":
            self._count(unauthorized=1)
            return _error(401, "invalid API key", "invalid_request_error")
        try:
            call, body = parse_call(raw, completion=endpoint.completion)
        except RequestRefused as exc:
            self._count(bad_requests=1)
            return _error(400, f"bad request: {exc}", "invalid_request_error", param=exc.param)
        check = getattr(self.backend, "check", None)
        try:  # a backend's own refusals that need no model (e.g. a prompt that cannot fit), before any slot
            if check is not None:
                check(call)
        except BackendRefusal as exc:
            self._count(bad_requests=1)
            return _error(400, str(exc), "invalid_request_error")
        serves = getattr(self.backend, "serves", None)
        if serves is not None and not serves(call.model):
            # answering under another name would let a run record a model it did not use
            self._count(bad_requests=1)
            return _error(404, f"model {call.model!r} is not served here; this server serves "
                               f"{self.backend.model_id!r} (GET /v1/models)", "invalid_request_error",
                          code="model_not_found")
        fault = self.faults.decide(raw)
        if fault == "429":
            self._count(http_429=1)
            retry = self.faults.retry_after
            reply = _error(429, "rate limited (injected)", "rate_limit")
            return reply if retry is None else _Reply(429, reply.body, {"Retry-After": f"{retry:g}"})
        if fault == "500":
            self._count(http_500=1)
            return _error(500, "server error (injected)", "server_error")
        if fault == "stall":
            self._count(stalls=1)
            self._stopping.wait(self.faults.stall_seconds)
        completion_id = endpoint.id_prefix + hashlib.sha256(raw).hexdigest()[:24]
        if body.get("stream") is True:
            self._wait_until(arrived + self.latency)
            return self._stream(call, body, completion_id, handler, endpoint)
        try:
            # the latency is the answer's time from arrival: the backend's own work and the
            # encoding of the answer are inside it (the handler waits after buffering it)
            done = self.backend.complete(call, _WhileWanted(handler))
        except ClientGone:
            raise
        except BackendRefusal as exc:
            self._count(bad_requests=1)
            return _error(400, str(exc), "invalid_request_error")
        except Exception as exc:  # a backend failure is the server's error, said in one line
            self._count(http_500=1)
            return _error(500, f"backend failed: {type(exc).__name__}: {exc}", "server_error")
        self._count(ok=1, prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens)
        return _Reply(200, {
            "id": completion_id, "object": endpoint.object, "created": 0,
            "model": self.backend.reported_model(call.model),
            "choices": [endpoint.choice(done.text, done.finish_reason)],
            "usage": _usage(done),
        }, not_before=arrived + self.latency)

    @staticmethod
    def _wait_until(deadline: float) -> None:
        left = deadline - time.monotonic()
        if left > 0:
            time.sleep(left)

    def _stream(self, call: ChatCall, body: dict[str, Any], completion_id: str, handler: _Handler,
                endpoint: Endpoint = CHAT_ENDPOINT) -> _Reply:
        """Server-sent events in the OpenAI chunk format of ``endpoint``; the usage chunk is sent
        when the client asks (``stream_options.include_usage``). A refusal found before the first
        piece is still an ordinary JSON error."""
        model = self.backend.reported_model(call.model)
        started = False
        wanted = _WhileWanted(handler)

        def chunk(choice: dict[str, Any]) -> dict[str, Any]:
            return {"id": completion_id, "object": endpoint.chunk_object, "created": 0, "model": model,
                    "choices": [choice]}

        def open_stream() -> None:
            nonlocal started
            if not started:
                handler.start_events()
                if not endpoint.completion:
                    handler.send_event(chunk(endpoint.piece("", None, opening=True)))
                started = True

        def on_text(piece: str) -> None:
            wanted(piece)
            if piece:
                open_stream()
                handler.send_event(chunk(endpoint.piece(piece, None)))

        try:
            done = self.backend.complete(call, on_text=on_text)
        except (BrokenPipeError, ConnectionResetError, ClientGone):
            raise
        except Exception as exc:
            refused = isinstance(exc, BackendRefusal)
            self._count(**{"bad_requests" if refused else "http_500": 1})
            reply = (_error(400, str(exc), "invalid_request_error") if refused else
                     _error(500, f"backend failed: {type(exc).__name__}: {exc}", "server_error"))
            if not started:
                return reply
            handler.send_event(reply.body)  # the status line is gone: say it in the stream, then end it
            return _Reply(reply.status, None)
        open_stream()  # an empty answer still opens the stream
        handler.send_event(chunk(endpoint.piece("", done.finish_reason)))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            handler.send_event({"id": completion_id, "object": endpoint.chunk_object, "created": 0,
                                "model": model, "choices": [], "usage": _usage(done)})
        handler.send_event("[DONE]")
        self._count(ok=1, prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens)
        return _Reply(200, None)


class _WhileWanted:
    """The ``on_text`` of a request that is not streamed: it keeps no text, and raises
    :class:`ClientGone` once the client has disconnected (checked at most every
    :data:`GONE_CHECK_SECONDS`, so a backend may call it per token)."""

    def __init__(self, handler: _Handler) -> None:
        self.handler, self.checked = handler, 0.0

    def __call__(self, piece: str) -> None:
        now = time.monotonic()
        if now - self.checked >= GONE_CHECK_SECONDS:
            self.checked = now
            if self.handler.client_gone():
                raise ClientGone("the client disconnected")


def _usage(done: Completion) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}
