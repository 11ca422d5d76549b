"""One OpenAI-compatible server on loopback, in front of a pluggable backend.

The server owns the protocol: ``GET /v1/models``, ``POST /v1/chat/completions`` (messages in,
``choices[0].message.content`` out) and ``POST /v1/completions`` (a prompt string in,
``choices[0].text`` out), each as JSON or as server-sent events with ``"stream": true``;
``usage`` counts, ``finish_reason``, ``stop`` sequences, bearer-token checks, request validation
(a bad body is a 400 JSON error, never a traceback), counters (:class:`ServerStats`) and, for
tests, seeded fault injection (:class:`FaultPlan`). A :class:`Backend` only turns one validated
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
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Protocol

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

# Body fields the server interprets itself; every other field reaches the backend as ``extra``.
PROTOCOL_FIELDS = ("messages", "prompt", "model", "temperature", "max_tokens", "stop")
STREAM_FIELDS = ("stream", "stream_options")
MAX_STOP_SEQUENCES = 4  # as the OpenAI API allows


class StopScanner:
    """Cuts generated text at the first of the request's stop sequences, as the OpenAI API does:
    the answer ends before the stop sequence, which is not part of it. Fed piece by piece, it
    holds back only the tail that could still be the start of a stop sequence, so a streamed
    answer never shows text the whole answer would not have."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = tuple(s for s in stop if s)
        self._keep = max((len(s) for s in self.stop), default=1) - 1
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The text that may be shown now; after a stop sequence, nothing more."""
        if self.stopped:
            return ""
        text = self._held + piece
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return text[:min(hits)]
        if not self.stop:
            return text
        cut = max(0, len(text) - self._keep)
        self._held = text[cut:]
        return text[:cut]

    def flush(self) -> str:
        """What is still held back when the text ended without a stop sequence."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


def apply_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` cut before its first stop sequence, and whether one was found."""
    scanner = StopScanner(stop)
    out = scanner.feed(text)
    return (out, True) if scanner.stopped else (out + scanner.flush(), False)


def unit_interval(*parts: object) -> float:
    """A reproducible number in [0, 1) from the parts' text."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


# -- what a backend sees and returns -----------------------------------------------------------------
@dataclass(frozen=True)
class ChatCall:
    """One validated request. A chat (``/v1/chat/completions``) has ``messages``, a non-empty
    list of ``{role, content: str}``, and ``prompt`` None; a completion (``/v1/completions``) has
    ``prompt``, the exact text to continue (no chat template, no system message), and no
    messages. ``max_tokens`` is None or a positive int; ``extra`` holds every other body field
    except the streaming switches (so a streamed request and a plain one are the same call)."""

    messages: list[dict[str, Any]]
    model: str
    temperature: float = 0.0
    max_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    stop: tuple[str, ...] = ()  # the answer ends before the first of these (finish_reason "stop")
    prompt: str | None = None  # set exactly for a completion

    @property
    def is_completion(self) -> bool:
        return self.prompt is not None


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


class Backend(Protocol):
    """Turns a call (a chat, or a completion's prompt: see :class:`ChatCall`) into a completion. ``on_text``, when given, receives the text as it is
    produced, in pieces whose concatenation is ``Completion.text`` (for streaming). Must be safe
    to call from several threads (serialise inside if the model holds state). ``model_id`` is
    listed by ``/v1/models``; ``reported_model`` names the model in each answer."""

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


def _error(status: int, message: str, kind: str, code: str | None = None) -> _Reply:
    return _Reply(status, {"error": {"message": message, "type": kind, **({"code": code} if code else {})}})


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
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        endpoint = ROUTES.get(self.path.rstrip("/"))
        if endpoint is None:
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        owner = self.server.owner
        with owner._in_flight_slot():
            try:
                reply = owner._answer(raw, self.headers.get("Authorization"), self, endpoint)
            except (BrokenPipeError, ConnectionResetError):
                return  # a streaming client went away mid-answer
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
    token; ``faults`` injects seeded 429/500/stalls; ``latency`` is every successful answer's time from arrival.
    Use as a context manager, or ``start()``/``stop()``."""

    def __init__(self, backend: Backend, *, api_key: str | None = None, faults: FaultPlan | None = None,
                 latency: float = 0.0, host: str = "127.0.0.1", port: int = 0, name: str = "model") -> None:
        if host not in LOOPBACK_HOSTS:
            raise ValueError(f"the {name} server listens on loopback only, not {host!r}")
        self.backend = backend
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

    @staticmethod
    def _parse(raw: bytes, endpoint: Endpoint = CHAT_ENDPOINT) -> tuple[ChatCall, dict[str, Any]]:
        body = json.loads(raw.decode("utf-8"))
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        if "messages" in body and "prompt" in body:
            raise ValueError("give messages (POST /v1/chat/completions) or a prompt (POST /v1/completions), not both")
        messages, prompt = [], None
        if endpoint.completion:
            if "prompt" not in body:
                raise ValueError("prompt is required: the text to continue (chat messages go to /v1/chat/completions)")
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise ValueError("prompt must be a string (lists of prompts or of token ids are not served)")
        else:
            if "messages" not in body:
                raise ValueError("messages is required (a prompt string goes to /v1/completions)")
            messages = body["messages"]
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
                raise ValueError("messages must be a non-empty list of {role, content}")
        model = body.get("model")
        if not isinstance(model, str):
            raise ValueError("model must be a string")
        temperature = body.get("temperature") or 0.0
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError("temperature must be a number >= 0")
        max_tokens = body.get("max_tokens")
        if not (isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0):
            max_tokens = None  # absent or unusable: the backend's own bound applies
        stop = body.get("stop")
        stop = (stop,) if isinstance(stop, str) else stop if stop is not None else ()
        if not (isinstance(stop, (list, tuple)) and len(stop) <= MAX_STOP_SEQUENCES
                and all(isinstance(x, str) and x for x in stop)):
            raise ValueError(f"stop must be a non-empty string or a list of at most {MAX_STOP_SEQUENCES} of them")
        extra = {k: v for k, v in body.items() if k not in PROTOCOL_FIELDS + STREAM_FIELDS}
        return ChatCall(messages, model, float(temperature), max_tokens, extra, tuple(stop), prompt), body

    def _answer(self, raw: bytes, authorization: str | None, handler: _Handler,
                endpoint: Endpoint = CHAT_ENDPOINT) -> _Reply:
        arrived = handler.arrived
        if self.api_key is not None and authorization != f"Bearer {self.api_key}":
            self._count(unauthorized=1)
            return _error(401, "invalid API key", "invalid_request_error")
        try:
            call, body = self._parse(raw, endpoint)
        except (ValueError, KeyError, TypeError) as exc:
            self._count(bad_requests=1)
            return _error(400, f"bad request: {exc}", "invalid_request_error")
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
            done = self.backend.complete(call)
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

        def chunk(choice: dict[str, Any]) -> dict[str, Any]:
            return {"id": completion_id, "object": endpoint.chunk_object, "created": 0, "model": model,
                    "choices": [choice]}

        def on_text(piece: str) -> None:
            nonlocal started
            if not started:
                handler.start_events()
                if not endpoint.completion:
                    handler.send_event(chunk(endpoint.piece("", None, opening=True)))
                started = True
            if piece:
                handler.send_event(chunk(endpoint.piece(piece, None)))

        try:
            done = self.backend.complete(call, on_text=on_text)
        except (BrokenPipeError, ConnectionResetError):
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
        on_text("")  # an empty answer still opens the stream
        handler.send_event(chunk(endpoint.piece("", done.finish_reason)))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            handler.send_event({"id": completion_id, "object": endpoint.chunk_object, "created": 0,
                                "model": model, "choices": [], "usage": _usage(done)})
        handler.send_event("[DONE]")
        self._count(ok=1, prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens)
        return _Reply(200, None)


def _usage(done: Completion) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}
