"""The one probe of a model endpoint (:func:`check_endpoint`), asked by every command that talks to
one before it writes anything (a study's commands through
:func:`heldout.protocols.preflight.check_infrastructure`, ``eval``, ``leak ablate``) and by a study
after a cell lost its endpoint, before the next cell starts (:func:`heldout.protocols.run.run_study`)."""

from __future__ import annotations

import os

from heldout.contracts import InfrastructureFailure
from heldout.models.client import ModelClient
from heldout.models.types import ModelError, model_failure_kind

#: seconds the probe waits for its one-token answer: a server that accepted the connection and
#: says nothing is found in this long (the probe waited 60 s twice, two minutes of silence, before);
#: not less, because a live one-slot local model busy with another client's answer (a second
#: study on the same endpoint) answers the probe only after it, and a refusal of a live endpoint
#: is worse than the wait (tests: a loopback model answering in 15 s is an endpoint)
PROBE_TIMEOUT = 30.0


def check_endpoint(role: str, model: str, base_url: str | None, timeout: float = PROBE_TIMEOUT,
                   then: str = "nothing was run or written") -> None:
    """One short request to ``model``, sent once and answered within ``timeout`` seconds. A refused
    port, a server that accepts and never answers, one that answers 503, or 200 with something that
    is not a chat completion, a mistyped URL or a wrong model name is one
    :class:`InfrastructureFailure` naming the URL and what went wrong, where the work's own
    requests would each be retried with backoff for minutes (a refusal of the request itself, a
    400, is no such failure). ``then`` says what the command did about it."""
    where = base_url or os.environ.get("OPENAI_BASE_URL") or "no --base-url / $OPENAI_BASE_URL"
    try:
        client = ModelClient(model, base_url=base_url, concurrency=1, max_retries=0, timeout=timeout)
    except ModelError as exc:
        raise InfrastructureFailure(f"the {role} model {model!r}: {exc}; {then}") from None
    try:
        client.complete(client.request([{"role": "user", "content": "Reply with OK."}], max_tokens=1,
                                       temperature=0.0, channel="worker-deployment" if role == "worker" else role))
    except ModelError as exc:
        if model_failure_kind(exc) == "model_error":
            raise InfrastructureFailure(
                f"the {role} model {model!r} at {where} does not answer ({' '.join(str(exc).split())[:300]}); "
                f"{then}: start the endpoint or fix --base-url / --worker-model") from None
    finally:
        client.close()


def check_endpoints(worker: str | None, architect: str | None, base_url: str | None,
                    then: str = "nothing was run or written") -> None:
    """:func:`check_endpoint` of each model a study talks to: its worker, and its architect unless
    that is the worker model."""
    for role, model in (("worker", worker), ("architect", architect)):
        if model and (role == "worker" or model != worker):
            check_endpoint(role, model, base_url, then=then)


__all__ = ["PROBE_TIMEOUT", "check_endpoint", "check_endpoints"]
