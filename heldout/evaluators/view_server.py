"""Serve one session's TaskView over HTTP, for optimizers that run as separate processes.

The server exposes exactly what :class:`~heldout.evaluators.view.SessionView` exposes, behind a
per-session random bearer token, on a Unix socket (reachable from a child in a fresh network
namespace, when the socket's directory is visible to it) and/or on 127.0.0.1:

=========================  ==================================================================
``GET  /task``             task, description, kind, seed_candidate, train, val, policy, budget,
                           remaining, metric (the spec's record fields: its name, direction,
                           aggregation and failure score)
``POST /evaluate``         ``{candidate, split="train", ids=null, parent=null}`` -> ``{results,
                           remaining}``; results are filtered by the visibility policy
``POST /architect``        ``{messages, temperature=1.0, max_tokens=null, replicate=0}`` ->
                           ``{text, architect_tokens_used}`` (metered on the architect channel)
``GET  /remaining``        ``{remaining, metric_calls, architect_tokens_used}``
``POST /final``            ``{candidate}`` -> ``{candidate_id}``: the optimizer's final answer
                           (the last submission wins; see :mod:`heldout.adapters.client`)
``POST /event``            ``{kind, data={}}`` -> ``{recorded}``: mechanism evidence for the ledger
=========================  ==================================================================

Errors are JSON ``{"error": message, "kind": kind}``: 400 malformed request or candidate, 401
wrong token, 402 budget exceeded (nothing ran), 403 not visible (e.g. the test split), 404
unknown route, 405 wrong method, 411/413 missing or oversized body, 409 no architect configured,
502 architect model error, 500 evaluator error.

**Forbidden attempts are recorded.** A request with a wrong (or another session's) token, an
unknown route or method, or one the visibility policy refuses (the test split, ids outside the
split) is refused *and* appended to the session ledger as a ``forbidden_attempt`` entry (the
token itself is never written, only a short hash of it). After ``max_recorded_attempts`` entries
further attempts are only counted, and the count is recorded when the server closes, so a hostile
optimizer cannot flood the ledger.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socketserver
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from heldout.contracts import Candidate, HeldoutError, MalformedCandidate, candidate_id, check_candidate, json_safe
from heldout.contracts import BudgetExceeded, InfrastructureFailure, VisibilityError
from heldout.evaluators.session import Session
from heldout.models import ModelError

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_RECORDED_ATTEMPTS = 100
EVALUATE_KEYS = {"candidate", "split", "ids", "parent"}
ARCHITECT_KEYS = {"messages", "temperature", "max_tokens", "replicate"}


class BadRequest(HeldoutError):
    """The request body is not what the route expects (HTTP 400)."""


def token_fingerprint(token: str) -> str:
    """A short, non-reversible tag of a presented token, safe to write into the ledger."""
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()[:12]


class _Handler(BaseHTTPRequestHandler):
    server_version = "heldout-view/1"
    timeout = 120  # a client that stalls mid-request does not hold a thread forever
    view_server: "ViewServer"  # set on the per-server subclass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # the ledger is the record; per-request logging would only add noise

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.view_server._dispatch(self, "GET")

    def do_POST(self) -> None:  # noqa: N802
        self.view_server._dispatch(self, "POST")

    def do_PUT(self) -> None:  # noqa: N802
        self.view_server._dispatch(self, "PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self.view_server._dispatch(self, "DELETE")


class _BoundedThreads:
    """Back-pressure: at most ``limit`` requests are served at once (the accept loop waits)."""

    limit_requests: threading.BoundedSemaphore

    def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
        self.limit_requests.acquire()
        try:
            super().process_request(request, client_address)  # type: ignore[misc]
        except BaseException:
            self.limit_requests.release()
            raise

    def process_request_thread(self, request, client_address):  # type: ignore[no-untyped-def]
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self.limit_requests.release()


class _TCPServer(_BoundedThreads, ThreadingHTTPServer):
    daemon_threads = True


class _UnixServer(_BoundedThreads, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class ViewServer:
    """HTTP front of one session's view. Use as a context manager, or :meth:`start` /
    :meth:`close`. ``socket_path`` (a path inside a private directory) and/or ``host``
    (127.0.0.1 or ::1 only) choose the transports; ``token`` defaults to a fresh random one."""

    def __init__(self, session: Session, *, socket_path: str | Path | None = None,
                 host: str | None = None, port: int = 0, token: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_recorded_attempts: int = DEFAULT_MAX_RECORDED_ATTEMPTS,
                 max_concurrent_requests: int = 32) -> None:
        if socket_path is None and host is None:
            raise ValueError("ViewServer needs a socket_path and/or a host (127.0.0.1)")
        if host is not None and host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError(f"the view is served on loopback only, not {host!r}")
        self.session = session
        self.view = session.view
        self.token = token or secrets.token_urlsafe(32)
        self.socket_path = str(socket_path) if socket_path is not None else None
        self._host, self._port = host, port
        self.max_body_bytes = max_body_bytes
        self.max_recorded_attempts = max_recorded_attempts
        self._max_concurrent = max_concurrent_requests
        self._servers: list[socketserver.BaseServer] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.final: Candidate | None = None
        self.forbidden_attempts = 0
        self._suppressed = 0
        self.url: str | None = None
        self._routes: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
            "/task": ("GET", self._task), "/remaining": ("GET", self._remaining),
            "/evaluate": ("POST", self._evaluate), "/architect": ("POST", self._architect),
            "/final": ("POST", self._final), "/event": ("POST", self._event),
        }

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "ViewServer":
        handler = type("ViewHandler", (_Handler,), {"view_server": self})
        if self.socket_path is not None:
            if os.path.lexists(self.socket_path):
                os.unlink(self.socket_path)  # a stale socket of a previous run in the same dir
            self._add(_UnixServer(self.socket_path, handler))
        if self._host is not None:
            server = _TCPServer((self._host, self._port), handler)
            self._add(server)
            host = f"[{self._host}]" if ":" in self._host else self._host
            self.url = f"http://{host}:{server.server_address[1]}"
        return self

    def _add(self, server: socketserver.BaseServer) -> None:
        server.limit_requests = threading.BoundedSemaphore(self._max_concurrent)  # type: ignore[attr-defined]
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                  name=f"heldout-view-{len(self._servers)}", daemon=True)
        thread.start()
        self._servers.append(server)
        self._threads.append(thread)

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        self._servers.clear()
        self._threads.clear()
        if self.socket_path is not None and os.path.lexists(self.socket_path):
            os.unlink(self.socket_path)
        with self._lock:
            suppressed, self._suppressed = self._suppressed, 0
        if suppressed:
            self.session.service.record_event("forbidden_attempts_suppressed", {"count": suppressed})

    def __enter__(self) -> "ViewServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def child_env(self) -> dict[str, str]:
        """The variables :meth:`heldout.adapters.client.TaskClient.from_env` reads."""
        env = {"HELDOUT_VIEW_TOKEN": self.token}
        if self.socket_path is not None:
            env["HELDOUT_VIEW_SOCKET"] = self.socket_path
        if self.url is not None:
            env["HELDOUT_VIEW_URL"] = self.url
        return env

    # -- request handling -----------------------------------------------------------------------
    def _dispatch(self, req: _Handler, method: str) -> None:
        path = req.path
        try:
            presented = req.headers.get("Authorization", "")
            scheme, _, token = presented.partition(" ")
            if scheme != "Bearer" or not hmac.compare_digest(token.strip().encode(), self.token.encode()):
                self.record_forbidden("bad_token", method, path,
                                      token_sha256=token_fingerprint(token.strip()) if token else None)
                self._discard_body(req)
                return self._send(req, 401, {"error": "missing or wrong session token", "kind": "unauthorized"})
            route = self._routes.get(path)
            if route is None:
                self.record_forbidden("unknown_route", method, path)
                self._discard_body(req)
                return self._send(req, 404, {"error": f"no route {path!r}; routes: {', '.join(self._routes)}",
                                             "kind": "unknown_route"})
            if route[0] != method:
                self.record_forbidden("wrong_method", method, path)
                self._discard_body(req)
                return self._send(req, 405, {"error": f"{path} takes {route[0]}, not {method}",
                                             "kind": "wrong_method"})
            body = self._read_body(req) if method == "POST" else None
            if isinstance(body, int):
                return  # already answered (411/413)
            return self._send(req, 200, route[1](body))
        except BadRequest as exc:
            self._send(req, 400, {"error": str(exc), "kind": "bad_request"})
        except MalformedCandidate as exc:
            self._send(req, 400, {"error": str(exc), "kind": "malformed_candidate"})
        except BudgetExceeded as exc:
            self._send(req, 402, {"error": str(exc), "kind": "budget_exceeded"})
        except VisibilityError as exc:
            self._send(req, 403, {"error": str(exc), "kind": "not_visible"})
        except _Unavailable as exc:
            self._send(req, 409, {"error": str(exc), "kind": "unavailable"})
        except _ModelFailed as exc:
            self._send(req, 502, {"error": str(exc), "kind": "model_error"})
        except InfrastructureFailure as exc:  # the session has stopped: the cell ends incomplete
            self._send(req, 503, {"error": str(exc), "kind": "infrastructure"})
        except Exception as exc:  # noqa: BLE001 - the harness's fault, reported, never fatal
            self._send(req, 500, {"error": f"evaluator error: {type(exc).__name__}: {exc}",
                                  "kind": "evaluator_error"})

    def _discard_body(self, req: _Handler) -> None:
        """Read and drop the body of a request answered before it was read (401/404/405). Closing a
        socket with unread bytes in it resets the connection, and the client then sees a broken pipe
        instead of the answer. A body over the cap, or of no declared length, is left unread and the
        connection closed after the answer."""
        length = (req.headers.get("Content-Length") or "").strip()
        if not length:
            return
        if not length.isdigit() or int(length) > self.max_body_bytes:
            req.close_connection = True
            return
        req.rfile.read(int(length))

    def _read_body(self, req: _Handler) -> Any:
        length = req.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            req.close_connection = True
            self._send(req, 411, {"error": "POST needs a Content-Length", "kind": "length_required"})
            return 411
        size = int(length)
        if size > self.max_body_bytes:
            req.close_connection = True  # the body is left unread
            self._send(req, 413, {"error": f"request body of {size} bytes exceeds the cap of "
                                           f"{self.max_body_bytes} bytes", "kind": "too_large"})
            return 413
        raw = req.rfile.read(size)
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"request body is not JSON: {str(exc)[:200]}") from None

    @staticmethod
    def _send(req: _Handler, status: int, payload: dict[str, Any]) -> None:
        # strict JSON (no NaN or Infinity, which json.dumps writes and parsers outside Python
        # refuse): a candidate's feedback may hold either, e.g. a distance ratio over coincident points
        data = json.dumps(json_safe(payload), default=str, allow_nan=False).encode("utf-8")
        try:
            req.send_response(status)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; nothing to tell it

    def record_forbidden(self, reason: str, method: str, path: str, **detail: Any) -> None:
        """Append a ``forbidden_attempt`` to the ledger (up to the cap; then only count)."""
        with self._lock:
            self.forbidden_attempts += 1
            if self.forbidden_attempts > self.max_recorded_attempts:
                self._suppressed += 1
                return
        entry = {"reason": reason, "method": method, "path": path[:300]}
        entry.update({k: v for k, v in detail.items() if v is not None})
        self.session.service.record_event("forbidden_attempt", entry)

    # -- routes ---------------------------------------------------------------------------------
    def _task(self, _: Any) -> dict[str, Any]:
        view = self.view
        return {"task": view.task_name, "description": view.description, "kind": view.kind,
                "seed_candidate": view.seed_candidate, "train": view.train, "val": view.val,
                "policy": self.session.policy.to_dict(), "verifier": view.verifier,
                "budget": asdict(view.budget), "remaining": view.remaining,
                "metric": view.metric.record_fields()}

    def _remaining(self, _: Any) -> dict[str, Any]:
        return {"remaining": self.view.remaining, "metric_calls": self.session.service.usage.metric_calls,
                "architect_tokens_used": self.view.architect_tokens_used}

    def _evaluate(self, body: Any) -> dict[str, Any]:
        body = _object(body, EVALUATE_KEYS, required={"candidate"})
        split = body.get("split", "train")
        ids = body.get("ids")
        parent = body.get("parent")
        if not isinstance(split, str):
            raise BadRequest("split must be a string: train or val")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
            raise BadRequest("ids must be a list of example id strings, or null for the whole split")
        if parent is not None and not isinstance(parent, str):
            raise BadRequest("parent must be a candidate id string or null")
        check_candidate(body["candidate"])
        try:
            results = self.view.evaluate(body["candidate"], split, ids, parent)
        except VisibilityError as exc:
            self.record_forbidden("not_visible", "POST", "/evaluate", split=split[:50],
                                  ids=None if ids is None else len(ids), error=str(exc)[:300])
            raise
        return {"results": results, "remaining": self.view.remaining}

    def _architect(self, body: Any) -> dict[str, Any]:

        body = _object(body, ARCHITECT_KEYS, required={"messages"})
        messages = body["messages"]
        if not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages)):
            raise BadRequest("messages must be a non-empty list of {role, content} string pairs")
        temperature = body.get("temperature", 1.0)
        max_tokens = body.get("max_tokens")
        replicate = body.get("replicate", 0)
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
            raise BadRequest("temperature must be a number")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise BadRequest("max_tokens must be a positive integer or null")
        if not isinstance(replicate, int) or replicate < 0:
            raise BadRequest("replicate must be a non-negative integer")
        try:
            text = self.view.architect(
                [{"role": m["role"], "content": m["content"]} for m in messages],
                temperature=float(temperature), max_tokens=max_tokens, replicate=replicate)
        except (BudgetExceeded, InfrastructureFailure):
            raise
        except ModelError as exc:
            raise _ModelFailed(str(exc)) from None
        except HeldoutError as exc:
            raise _Unavailable(str(exc)) from None
        return {"text": text, "architect_tokens_used": self.view.architect_tokens_used}

    def _event(self, body: Any) -> dict[str, Any]:
        body = _object(body, {"kind", "data"}, required={"kind"})
        data = body.get("data") or {}
        if not isinstance(data, dict):
            raise BadRequest("data must be a JSON object")
        try:
            self.view.record_event(body["kind"], **{str(k): v for k, v in data.items()})
        except HeldoutError as exc:
            raise BadRequest(str(exc)) from None
        return {"recorded": True}

    def _final(self, body: Any) -> dict[str, Any]:
        body = _object(body, {"candidate"}, required={"candidate"})
        check_candidate(body["candidate"])
        final = dict(body["candidate"])
        cid = candidate_id(final)
        with self._lock:
            self.final = final
        self.session.service.record_event("final_submitted", {"candidate_id": cid})
        return {"candidate_id": cid}


class _Unavailable(HeldoutError):
    pass


class _ModelFailed(HeldoutError):
    pass


def _object(body: Any, allowed: set[str], required: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    unknown = set(body) - allowed
    if unknown:
        raise BadRequest(f"unknown field(s) {sorted(unknown)}; this route takes {sorted(allowed)}")
    missing = required - set(body)
    if missing:
        raise BadRequest(f"missing field(s) {sorted(missing)}")
    return body


__all__ = ["BadRequest", "ViewServer", "token_fingerprint", "DEFAULT_MAX_BODY_BYTES"]
