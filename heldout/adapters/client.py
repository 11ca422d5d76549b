"""The client an isolated optimizer uses to reach its task view (standard library only).

An isolated optimizer (``heldout run ... --optimizer-cmd "CMD"``) runs in a separate, sandboxed
process. The harness serves its session's :class:`~heldout.evaluators.view.SessionView` over HTTP
(:mod:`heldout.evaluators.view_server`) and passes the address in the environment:

* ``HELDOUT_VIEW_SOCKET``: path of a Unix socket (used when set; it works inside a network
  namespace that has no usable loopback), or
* ``HELDOUT_VIEW_URL``: ``http://127.0.0.1:PORT``;
* ``HELDOUT_VIEW_TOKEN``: the session's bearer token.

The optimizer **returns its final candidate** with :meth:`TaskClient.submit_final` (``POST
/final``). It may submit as often as it likes (e.g. its best so far after every improvement); the
last submission before the process exits is the one the harness scores on the test split. The
run counts as successful only if the process exits with status 0 and has submitted a final.

    from heldout.adapters.client import TaskClient

    client = TaskClient.from_env()
    seed = client.seed_candidate
    results = client.evaluate(seed, "train", ids=[ex["id"] for ex in client.train[:10]])
    client.submit_final(seed)

:class:`TaskClient` implements the :class:`heldout.contracts.TaskView` Protocol, like the
in-process view: the same names (``task_name``, ``train``, ``val``, ``metric``, ``remaining``,
``evaluate``, ``architect``, ``record_event`` ...) and the same errors, so one optimizer function
runs in both modes. Refusals arrive as exceptions with the server's message: :class:`BudgetExceeded` (HTTP 402,
nothing ran) and :class:`VisibilityError` (403, e.g. the test split), the classes of
:mod:`heldout.contracts`, also instances of :class:`RequestRefused` (which any other 4xx/5xx
raises) with the HTTP status; a malformed candidate (400) is a :class:`MalformedCandidate` too.
This module needs only the standard library and ``heldout.contracts``: the harness copies both
into the optimizer's sandbox.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import urlsplit

from heldout.contracts import (BudgetExceeded, HeldoutError, InfrastructureFailure, MalformedCandidate, MetricSpec,
                               VisibilityError, check_candidate)

URL_ENV = "HELDOUT_VIEW_URL"
SEED_ENV = "HELDOUT_SEED"  # the session seed the harness gives an isolated optimizer
SOCKET_ENV = "HELDOUT_VIEW_SOCKET"
TOKEN_ENV = "HELDOUT_VIEW_TOKEN"


class RequestRefused(HeldoutError):
    """The view server refused a request; ``status`` is the HTTP status, ``kind`` its error kind."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(f"HTTP {status} {kind}: {message}")
        self.status = status
        self.kind = kind
        self.message = message


class HTTPBudgetExceeded(RequestRefused, BudgetExceeded):
    """HTTP 402: the evaluation (or architect call) would exceed the budget; nothing ran."""


class HTTPVisibilityError(RequestRefused, VisibilityError):
    """HTTP 403: the request asked for something the visibility policy does not allow."""


class HTTPMalformedCandidate(RequestRefused, MalformedCandidate):
    """HTTP 400 ``malformed_candidate``: not a non-empty ``dict[str, str]``; nothing ran. The
    in-process view raises :class:`MalformedCandidate` for it, so an optimizer that catches it to
    skip a bad proposal does so in both modes."""


class HTTPInfrastructureFailure(RequestRefused, InfrastructureFailure):
    """HTTP 503: the harness's endpoint or sandbox failed; the session has stopped (never a score)."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class TaskClient:
    """Methods mirror :class:`~heldout.evaluators.view.SessionView`. Thread-safe (one connection
    per request). ``timeout`` bounds each request; evaluations of slow tasks may need more."""

    def __init__(self, token: str, *, url: str | None = None, socket_path: str | None = None,
                 timeout: float = 3600.0) -> None:
        if not token:
            raise ValueError("TaskClient needs the session token")
        if not url and not socket_path:
            raise ValueError("TaskClient needs a url (http://127.0.0.1:PORT) or a Unix socket path")
        self._token = token
        self._socket_path = socket_path
        self._timeout = timeout
        self._host = self._port = None
        if not socket_path:
            parsed = urlsplit(url)
            if parsed.scheme != "http" or not parsed.hostname:
                raise ValueError(f"view url must look like http://127.0.0.1:PORT, got {url!r}")
            self._host, self._port = parsed.hostname, parsed.port or 80
        self._task: dict[str, Any] | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, timeout: float = 3600.0) -> "TaskClient":
        env = os.environ if environ is None else environ
        token = env.get(TOKEN_ENV)
        if not token or not (env.get(SOCKET_ENV) or env.get(URL_ENV)):
            raise RuntimeError(f"not started by heldout: set {TOKEN_ENV} and {SOCKET_ENV} or {URL_ENV}")
        return cls(token, url=env.get(URL_ENV), socket_path=env.get(SOCKET_ENV) or None, timeout=timeout)

    # -- transport ------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One JSON request; returns the decoded answer or raises :class:`RequestRefused`."""
        if self._socket_path:
            conn: http.client.HTTPConnection = _UnixConnection(self._socket_path, self._timeout)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        payload = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = {"error": raw[:500].decode("utf-8", "replace"), "kind": "bad_response"}
        if resp.status >= 400:
            info = data if isinstance(data, dict) else {}
            kind, message = str(info.get("kind", "error")), str(info.get("error", raw[:500]))
            cls = {402: HTTPBudgetExceeded, 403: HTTPVisibilityError,
                   503: HTTPInfrastructureFailure}.get(resp.status, RequestRefused)
            if resp.status == 400 and kind == "malformed_candidate":
                cls = HTTPMalformedCandidate
            raise cls(resp.status, kind, message)
        return data

    # -- the view -------------------------------------------------------------------------------
    @property
    def task(self) -> dict[str, Any]:
        """Everything ``GET /task`` returns (fetched once): task, description, kind,
        seed_candidate, train, val, policy, budget, remaining (at fetch time), metric."""
        if self._task is None:
            self._task = self.request("GET", "/task")
        return self._task

    @property
    def task_name(self) -> str:
        return str(self.task["task"])

    @property
    def description(self) -> str:
        return str(self.task["description"])

    @property
    def kind(self) -> str:
        return str(self.task["kind"])

    @property
    def policy(self) -> str:
        """The visibility policy's name (the full policy is in ``task["policy"]``)."""
        return str(self.task["policy"]["name"])

    @property
    def verifier(self) -> str:
        return str(self.task.get("verifier", "decomposed"))

    @property
    def metric(self) -> MetricSpec:
        """The task's metric, as the in-process view has it: compare scores by its direction."""
        fields = self.task.get("metric")
        if not isinstance(fields, dict):  # guessing higher-is-better would make a cost worse
            raise HeldoutError("the view server stated no metric for this task")
        return MetricSpec.from_record(fields)

    @property
    def metric_calls_budget(self) -> int:
        return int(self.task["budget"]["metric_calls"])

    @property
    def seed_candidate(self) -> dict[str, str]:
        return dict(self.task["seed_candidate"])

    @property
    def train(self) -> list[dict[str, Any]]:
        """Train examples: id, input, target."""
        return self.task["train"]

    @property
    def val(self) -> list[dict[str, Any]]:
        """Val examples: id and input only."""
        return self.task["val"]

    @property
    def remaining(self) -> int:
        """Metric calls left (asked fresh every time)."""
        return int(self.request("GET", "/remaining")["remaining"])

    def evaluate(self, candidate: Mapping[str, str], split: str = "train", ids: Sequence[str] | None = None,
                 parent: str | None = None) -> list[dict[str, Any]]:
        """Score ``candidate`` on ``ids`` of ``split`` (all of it when None): one dict per example
        with the fields the visibility policy shows."""
        # refused here as the in-process view refuses them (a VisibilityError), not as a malformed request
        if type(split) is not str:
            raise HTTPVisibilityError(403, "not_visible", f"split must be exactly 'train' or 'val', got {split!r}")
        wanted = None if ids is None else list(ids)
        if wanted is not None and any(type(i) is not str for i in wanted):
            raise HTTPVisibilityError(403, "not_visible", "example ids are plain strings")
        body = {"candidate": _plain(candidate), "split": split, "ids": wanted, "parent": parent}
        return self.request("POST", "/evaluate", body)["results"]

    def architect(self, messages: Sequence[Mapping[str, str]], *, temperature: float = 1.0,
                  max_tokens: int | None = None, replicate: int = 0) -> str:
        """One metered call of the session's architect model; returns its text."""
        body = {"messages": [dict(m) for m in messages], "temperature": temperature,
                "max_tokens": max_tokens, "replicate": replicate}
        return self.request("POST", "/architect", body)["text"]

    @property
    def architect_tokens_used(self) -> int:
        return int(self.request("GET", "/remaining")["architect_tokens_used"])

    def record_event(self, kind: str, **data: Any) -> None:
        """Write mechanism evidence (``merge_attempt`` ...) to the session's ledger; free."""
        self.request("POST", "/event", {"kind": kind, "data": data})

    def submit_final(self, candidate: Mapping[str, str]) -> str:
        """Hand in the final candidate (the last submission wins); returns its candidate id."""
        return self.request("POST", "/final", {"candidate": _plain(candidate)})["candidate_id"]


def _plain(candidate: Any) -> dict[str, str]:
    """``candidate`` as the in-process view takes it (:func:`heldout.contracts.check_candidate`),
    refused here as the view server refuses a malformed one: JSON would turn an ``OrderedDict``,
    a ``str`` subclass or an integer name into a plain dict of text the in-process view refuses."""
    try:
        return check_candidate(candidate)
    except MalformedCandidate as exc:
        raise HTTPMalformedCandidate(400, "malformed_candidate", str(exc)) from None


def run_from_env(optimize: Callable[["TaskClient", int], Mapping[str, str]]) -> int:
    """An isolated optimizer's whole entry point: connect to the view the harness named in the
    environment, run ``optimize(client, seed)`` and submit what it returns as the final candidate."""
    client = TaskClient.from_env()
    client.submit_final(optimize(client, int(os.environ.get(SEED_ENV, "0"))))
    return 0


__all__ = ["BudgetExceeded", "MalformedCandidate", "RequestRefused", "TaskClient", "VisibilityError", "run_from_env",
           "SEED_ENV", "SOCKET_ENV", "TOKEN_ENV", "URL_ENV"]
