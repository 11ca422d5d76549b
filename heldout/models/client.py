"""OpenAI-compatible chat-completions and completions client: bounded concurrency, retries,
usage per channel.

One :class:`ModelClient` serves workers and architects alike; what a request is *for* travels in
:attr:`ChatRequest.channel`, so tokens are metered on the same scale for every optimizer. A
request is answered, in this order, from a :class:`~heldout.models.recording.Replay` (never the
endpoint), the :class:`~heldout.models.cache.ResponseCache`, or the endpoint itself. A request is
a chat (``messages``, to ``/chat/completions``) or a completion (a ``prompt`` string, to
``/completions``): both take the same path through replay, cache, retries and usage.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import json
import os
import queue
import threading
import time
import urllib.request
import weakref
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import httpx

from heldout.models.http11 import Connections, Reply
from heldout.models.pacing import AdaptiveLimit, backoff_delay, parse_retry_after, retryable_status
from heldout.models.types import BatchError, ChatRequest, ChatResponse, ModelError, UsageMeter

if TYPE_CHECKING:
    from heldout.models.cache import ResponseCache
    from heldout.models.recording import Recorder, Replay

def _proxied(url: str) -> bool:
    """Whether the environment routes ``url`` through a proxy (``HTTPS_PROXY`` ... ``NO_PROXY``):
    such calls go through an ``httpx.AsyncClient``, which speaks to proxies."""
    target, proxies = httpx.URL(url), urllib.request.getproxies()
    return bool(proxies.get(target.scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(target.host)


class _Engine:
    """A client's private event loop in a daemon thread, with the resources that belong to it.

    Every call of a client runs here, whichever thread or loop it comes from, so one concurrency
    bound, one set of connections and one table of in-flight requests hold for all of them."""

    def __init__(self, concurrency: int, adaptive: bool = False) -> None:
        self.pid = os.getpid()
        # made in an empty context: the loop's own reader (its self-pipe) keeps the context it was
        # made in as long as the loop lives (see submit)
        self.loop = contextvars.Context().run(asyncio.new_event_loop)
        self.gate = asyncio.Semaphore(concurrency)
        self.adaptive: AdaptiveLimit | None = None
        if adaptive:  # created on the loop's thread-independent state; used only inside the loop
            self.adaptive = AdaptiveLimit(concurrency)
        self.http: httpx.AsyncClient | Connections | None = None
        self.inflight: dict[str, asyncio.Future] = {}
        self.thread = threading.Thread(target=self._run, name="heldout-model-client", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, coro: Any) -> concurrent.futures.Future:
        # In an empty context, not the caller's: a task, and every socket reader it registers, keeps
        # the context it started in for as long as the loop runs. A caller's context can hold a
        # library's settings (DSPy's LM, reaching the session and this very client), so keep-alive
        # connections made in it would keep the client, its thread and sockets alive for good.
        return contextvars.Context().run(asyncio.run_coroutine_threadsafe, coro, self.loop)

    def stop(self) -> None:
        async def close_http() -> None:
            if self.http is not None:
                await self.http.aclose()
                self.http = None
        if threading.current_thread() is self.thread:
            # the collector ran this client's finalizer on the loop's own thread: waiting for the
            # loop from inside it would stall for the whole timeout and then fail to join itself
            self.loop.create_task(close_http()).add_done_callback(lambda _: self.loop.stop())
            return
        if self.thread.is_alive():
            try:
                self.submit(close_http()).result(timeout=10)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(timeout=10)


class ModelClient:
    """Chat completions against ``{base_url}/chat/completions`` and completions against
    ``{base_url}/completions`` (:meth:`request`, :meth:`completion_request`).

    ``base_url``/``api_key`` default to ``OPENAI_BASE_URL``/``OPENAI_API_KEY``; a client with a
    ``replay`` needs neither and never calls an endpoint. At most ``concurrency`` endpoint calls
    are in flight for the whole client, whichever threads call it. 429, 408, 5xx, timeouts and
    connection errors are retried up to ``max_retries`` times with exponential backoff and jitter
    (``Retry-After`` honoured); other statuses fail at once. With a cache, identical requests in
    flight at once share one call. With ``adaptive=True`` the bound is a ceiling: the client
    starts with two calls in flight and learns the endpoint's rate (:class:`AdaptiveLimit`),
    pacing its calls, backing off on 429 and honouring ``Retry-After`` for every call, not only the one refused.
    ``close()`` (or ``with``) releases connections."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, *,
                 concurrency: int = 16, max_retries: int = 6, timeout: float = 60.0,
                 cache: "ResponseCache | None" = None, recorder: "Recorder | None" = None,
                 replay: "Replay | None" = None, backoff_base: float = 0.5,
                 backoff_cap: float = 20.0, adaptive: bool = False) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError("ModelClient needs a model name")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        if base_url is None and replay is None:
            raise ModelError(
                "no model endpoint configured: pass base_url=... (e.g. http://127.0.0.1:8000/v1) "
                "or set OPENAI_BASE_URL; to run without an endpoint, replay a recording",
                kind="config")
        if base_url is not None and not base_url.startswith(("http://", "https://")):
            raise ModelError(f"base URL must start with http:// or https://, got {base_url!r}",
                             kind="config")
        self.model = model
        self.base_url = base_url.rstrip("/") if base_url else None
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.timeout = timeout
        self.cache = cache
        self.recorder = recorder
        self.replay = replay
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.adaptive = adaptive
        self.usage = UsageMeter()
        self._engine: _Engine | None = None
        self._engine_lock = threading.Lock()

    def __repr__(self) -> str:  # never shows the key
        return f"ModelClient(model={self.model!r}, base_url={self.base_url!r})"

    def request(self, messages: Any, **params: Any) -> ChatRequest:
        """A chat :class:`ChatRequest` for this client's model."""
        return ChatRequest(messages=messages, model=params.pop("model", self.model), **params)

    def completion_request(self, prompt: str, **params: Any) -> ChatRequest:
        """A completion :class:`ChatRequest` for this client's model: ``prompt`` is sent to
        ``/completions`` exactly as given (no chat template, no system message)."""
        return ChatRequest(prompt=prompt, model=params.pop("model", self.model), **params)

    # -- sync entry point ---------------------------------------------------------------------
    def complete_many(self, requests: Sequence[ChatRequest], *,
                      return_exceptions: bool = False) -> list[ChatResponse]:
        """Answer every request (bounded concurrency), keeping input order. Callable from any
        thread, also one that runs an event loop.

        Raises :class:`BatchError` (a :class:`ModelError`, clear message) when some request still
        fails after retries; every other response is cached, recorded and kept in
        ``error.results``. With ``return_exceptions=True`` the failures are returned in place."""
        requests = self._checked(requests)
        if not requests:
            return []
        engine = self._get_engine()
        future = engine.submit(self._complete_all(requests, engine))
        try:
            results = future.result()
        except BaseException:
            future.cancel()  # e.g. Ctrl-C: do not leave the batch running behind the caller
            raise
        if not return_exceptions and any(isinstance(r, ModelError) for r in results):
            raise BatchError(results)
        return results

    def complete_each(self, requests: Sequence[ChatRequest]) -> Iterator[tuple[int, ChatResponse | ModelError]]:
        """Answer every request as :meth:`complete_many` does with ``return_exceptions=True``, but
        yield ``(index, answer)`` as each answer arrives, so the caller works on one answer while
        the others are in flight (a session scores each output then). Leaving the loop early
        cancels what is still running. A subclass that overrides :meth:`complete_many` is served
        by it (its answers then come in input order, once all are in)."""
        requests = self._checked(requests)
        if type(self).complete_many is not ModelClient.complete_many:
            yield from enumerate(self.complete_many(requests, return_exceptions=True))
            return
        if not requests:
            return
        engine = self._get_engine()
        arrived: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()

        async def one(i: int, req: ChatRequest) -> None:
            try:
                arrived.put((i, await self._acomplete(req, engine)))
            except ModelError as exc:
                arrived.put((i, exc))
            except BaseException as exc:  # a bug or a cancellation: raised in the caller's thread
                arrived.put((i, _Raised(exc)))
                raise

        async def every() -> None:
            await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))

        future = engine.submit(every())
        try:
            for _ in range(len(requests)):
                i, answer = arrived.get()
                if isinstance(answer, _Raised):
                    raise answer.exc
                yield i, answer
        finally:
            future.cancel()  # nothing left when all arrived; else the caller left early or was interrupted

    def complete(self, request: ChatRequest) -> ChatResponse:
        """One request, synchronously; raises :class:`ModelError` when it fails."""
        result = self.complete_many([request], return_exceptions=True)[0]
        if isinstance(result, ModelError):
            raise result
        return result

    def _checked(self, requests: Sequence[ChatRequest]) -> list[ChatRequest]:
        requests = list(requests)
        for i, req in enumerate(requests):
            if not isinstance(req, ChatRequest):
                raise TypeError(f"request {i} is a {type(req).__name__}, not a ChatRequest")
        engine = self._engine
        if requests and engine is not None and threading.current_thread() is engine.thread:
            raise RuntimeError("complete_many called from the client's own event loop; await "
                               "acomplete there instead")
        return requests

    async def _complete_all(self, requests: list[ChatRequest], engine: _Engine) -> list[Any]:
        async def one(req: ChatRequest) -> Any:
            try:
                return await self._acomplete(req, engine)
            except ModelError as exc:
                return exc
        return await asyncio.gather(*(one(r) for r in requests))

    # -- lifecycle -----------------------------------------------------------------------------
    def _get_engine(self) -> _Engine:
        with self._engine_lock:
            engine = self._engine
            # A forked child inherits the engine object but not its thread: start afresh.
            if engine is None or engine.pid != os.getpid() or not engine.thread.is_alive():
                engine = self._engine = _Engine(self.concurrency, self.adaptive)
                weakref.finalize(self, engine.stop)
            return engine

    def close(self) -> None:
        """Close connections and stop the client's loop (a later call starts them again)."""
        with self._engine_lock:
            engine, self._engine = self._engine, None
        if engine is not None and engine.pid == os.getpid():
            engine.stop()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> "ModelClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- async API -----------------------------------------------------------------------------
    async def acomplete(self, request: ChatRequest) -> ChatResponse:
        """Answer one request from the replay, the cache or the endpoint (in that order); may be
        awaited from any event loop."""
        engine = self._get_engine()
        if asyncio.get_running_loop() is engine.loop:
            return await self._acomplete(request, engine)
        return await asyncio.wrap_future(engine.submit(self._acomplete(request, engine)))

    async def _acomplete(self, request: ChatRequest, engine: _Engine) -> ChatResponse:
        if not isinstance(request, ChatRequest):
            raise TypeError(f"acomplete takes a ChatRequest, got {type(request).__name__}")
        key = request.cache_key()
        started = time.perf_counter()
        if self.replay is not None:
            try:
                stored = self.replay.lookup(request)
            except ModelError:
                self.usage.add(request.channel, failures=1)
                raise
            return self._served(request, key, stored.text, stored.prompt_tokens,
                                stored.completion_tokens, "replay", started)
        if self.cache is None:
            return await self._fetch(request, key, engine)
        hit = self.cache.get(key)
        if hit is not None:
            return self._served(request, key, hit.text, hit.prompt_tokens,
                                hit.completion_tokens, "cache", started)
        leader = engine.inflight.get(key)
        if leader is not None:  # the same request is on its way: share its answer
            try:
                first = await asyncio.shield(leader)
            except ModelError:
                self.usage.add(request.channel, failures=1)
                raise
            return self._served(request, key, first.text, first.prompt_tokens,
                                first.completion_tokens, "cache", started)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # mark retrieved
        engine.inflight[key] = future
        try:
            response = await self._fetch(request, key, engine)
        except BaseException as exc:
            future.set_exception(exc if isinstance(exc, ModelError) else
                                 ModelError(f"request abandoned: {exc!r}", kind="connection",
                                            request_key=key))
            raise
        else:
            future.set_result(response)
            return response
        finally:
            engine.inflight.pop(key, None)

    def _served(self, request: ChatRequest, key: str, text: str, prompt_tokens: int,
                completion_tokens: int, source: str, started: float) -> ChatResponse:
        response = ChatResponse(text=text, prompt_tokens=prompt_tokens,
                                completion_tokens=completion_tokens, cached=True,
                                seconds=time.perf_counter() - started, request_key=key,
                                source=source)
        self.usage.record(request.channel, response)
        if self.recorder is not None:
            self.recorder.write(request, response)
        return response

    def _poster(self, http: "httpx.AsyncClient | Connections", url: str, body: bytes):
        """One attempt's POST of ``body`` to ``url``, through the proxy-aware httpx client or
        the client's own connections."""
        if isinstance(http, httpx.AsyncClient):
            return lambda: http.post(url, content=body, headers={"Content-Type": "application/json"})
        return lambda: http.post(url, body)

    def _connections(self, url: str) -> "httpx.AsyncClient | Connections":
        """The engine's HTTP connections: httpx's client when a proxy applies to ``url``, else
        heldout's own keep-alive connections to the endpoint."""
        if _proxied(url):
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            return httpx.AsyncClient(timeout=httpx.Timeout(self.timeout), headers=headers,
                                     limits=httpx.Limits(max_connections=self.concurrency,
                                                         max_keepalive_connections=self.concurrency))
        raw = [(b"Content-Type", b"application/json"), (b"Accept", b"application/json"), (b"User-Agent", b"heldout")]
        if self.api_key:
            raw.append((b"Authorization", f"Bearer {self.api_key}".encode()))
        try:
            return Connections(url, raw, self.timeout)
        except ValueError as exc:  # e.g. an API key with a line break: no request could carry it
            raise ModelError(f"cannot send requests to {url}: {exc}", kind="config") from None

    async def _fetch(self, request: ChatRequest, key: str, engine: _Engine) -> ChatResponse:
        url = f"{self.base_url}/{request.endpoint}"
        if engine.http is None:
            engine.http = self._connections(url)
        body = json.dumps(request.payload(), ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        post = self._poster(engine.http, url, body)
        channel = request.channel
        started = time.perf_counter()
        attempt = 0
        limit = engine.adaptive
        async with (engine.gate if limit is None else contextlib.nullcontext()):
            while True:
                attempt += 1
                self.usage.add(channel, http_attempts=1)
                retry_after = None
                epoch = 0
                try:
                    if limit is None:
                        reply = await post()
                    else:  # one place in the learned window per attempt, not per request
                        epoch = await limit.acquire()
                        sent = time.perf_counter()
                        try:
                            reply = await post()
                        finally:
                            limit.release()
                except httpx.TimeoutException as exc:
                    problem = ModelError(f"timed out after {self.timeout:g} s ({type(exc).__name__})",
                                         kind="timeout", request_key=key, attempts=attempt)
                except httpx.TransportError as exc:
                    problem = ModelError(f"cannot reach {url}: {type(exc).__name__}: {exc}",
                                         kind="connection", request_key=key, attempts=attempt)
                else:
                    if limit is not None and reply.status_code == 200:
                        limit.succeeded(time.perf_counter() - sent)
                    elif limit is not None and reply.status_code == 429:
                        limit.throttled(epoch, parse_retry_after(reply.headers.get("retry-after")))
                    if reply.status_code == 200:
                        try:
                            text, prompt_tokens, completion_tokens = _parse_completion(reply, request.is_completion)
                        except ModelError as exc:
                            exc.request_key, exc.attempts = key, attempt
                            self.usage.add(channel, failures=1)
                            raise
                        break
                    problem = ModelError(
                        f"{url} answered HTTP {reply.status_code}: {reply.text[:200]!r}",
                        kind="http_status", request_key=key, status=reply.status_code,
                        attempts=attempt)
                    if not retryable_status(reply.status_code):
                        self.usage.add(channel, failures=1)
                        raise problem
                    retry_after = reply.headers.get("retry-after")
                if attempt > self.max_retries:
                    self.usage.add(channel, failures=1)
                    raise ModelError(f"model request failed after {attempt} attempts; last: {problem}",
                                     kind=problem.kind, request_key=key, status=problem.status,
                                     attempts=attempt)
                self.usage.add(channel, retries=1)
                await asyncio.sleep(backoff_delay(attempt, retry_after, base=self.backoff_base,
                                                  cap=self.backoff_cap))
        seconds = time.perf_counter() - started
        response = ChatResponse(text=text, prompt_tokens=prompt_tokens,
                                completion_tokens=completion_tokens, cached=False, seconds=seconds,
                                request_key=key, source="endpoint", retries=attempt - 1)
        self.usage.record(channel, response)
        # Persist before returning, so a crash after this point loses no paid-for answer.
        if self.cache is not None:
            self.cache.put(key, request, response)
        if self.recorder is not None:
            self.recorder.write(request, response)
        return response


class _Raised:
    """An exception of one request's task other than a :class:`ModelError`, carried to the caller."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _parse_completion(reply: "httpx.Response | Reply", completion: bool = False) -> tuple[str, int, int]:
    """Text and token usage of a chat-completions body (``choices[0].message.content``) or, for
    a completion, of a completions body (``choices[0].text``); ModelError(kind='bad_response')
    if the body is not one."""
    what = "completion" if completion else "chat completion"
    try:
        body = reply.json()
        choice = body["choices"][0]
        content = choice["text"] if completion else choice["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"endpoint answered 200 but not a {what} ({type(exc).__name__}: "
                         f"{exc}): {reply.text[:200]!r}", kind="bad_response") from None
    if not isinstance(content, str):
        raise ModelError(f"{what} has no text content (got {type(content).__name__})",
                         kind="bad_response")
    usage = body.get("usage") or {}
    counts = (usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0) if isinstance(usage, dict) else ()
    # token counts are whole and not negative: a fraction, a boolean or a negative count booked as it
    # is would shrink a token budget or a report's cost
    if len(counts) != 2 or any(type(n) is not int or n < 0 for n in counts):
        raise ModelError(f"{what} has unreadable usage: {str(usage)[:200]}", kind="bad_response")
    return content, counts[0], counts[1]
