"""What every command that starts or continues a study checks before any file of it is written
(:func:`check_infrastructure`): a refused command writes nothing, and each refusal is one line
within seconds, not a study of zeros."""

from __future__ import annotations

import os

from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import HeldoutError, InfrastructureFailure
from heldout.evaluators.signing import KEY_ENV, KEY_FILE_ENV, load_signing_key, signing_key_path
from heldout.files import check_folder
from heldout.models import ModelClient, ModelError, model_failure_kind
from heldout.protocols.run import Cell, StudyConfig, cell_is_isolated
from heldout.sandbox import SandboxError, require_sandbox

#: seconds the probe (:func:`check_endpoint`) waits for its one-token answer: a local CPU model
#: answers in well under this, and a server that accepted the connection and says nothing is
#: found in this long (it waited 60 s twice, two minutes of silence, before); a study's own
#: timeout (--model-timeout) is for its long answers, not this one
PREFLIGHT_TIMEOUT = 10.0


def check_infrastructure(cells: list[Cell], config: StudyConfig) -> None:
    """What every command that starts or continues a study checks before any file of it is
    written (a refused command writes nothing): a worker model for prompt tasks, one short request
    to each model endpoint the study names, and the sandbox where a cell runs untrusted code (a
    program task, an isolated optimizer). A missing model is a :class:`HeldoutError`; a dead or
    mistyped URL, a wrong model name or a missing bubblewrap an :class:`InfrastructureFailure`;
    each one line within seconds, not a study of zeros."""
    check_signing_key()
    kinds = {cell.task: get_benchmark(cell.task).kind for cell in cells}
    prompt = sorted(task for task, kind in kinds.items() if kind == "prompt")
    if prompt and not config.worker_model:
        # found only in its first session, it would leave a study behind that the corrected
        # command then meets as "another study"
        raise HeldoutError(f"{prompt[0]} is a prompt task: the study needs a worker model (--worker-model and "
                           "--base-url, or worker and base_url under [models] in a study file); nothing was written")
    for role, model in (("worker", config.worker_model), ("architect", config.architect_model)):
        if not model or (role == "architect" and model == config.worker_model):
            continue
        check_endpoint(role, model, config.base_url)
    untrusted = [c for c in cells if c.method.command or cell_is_isolated(c, config) or kinds[c.task] == "program"]
    if untrusted:
        try:
            require_sandbox()
        except SandboxError as exc:
            raise InfrastructureFailure(f"{untrusted[0].label} runs untrusted code: {exc}; nothing was run or "
                                        "written") from None


def check_endpoint(role: str, model: str, base_url: str | None, timeout: float = PREFLIGHT_TIMEOUT) -> None:
    """The probe every command that talks to a model endpoint runs before it writes anything (a
    study's commands through :func:`check_infrastructure`, ``eval``, ``leak ablate``): one short
    request to ``model``, sent once, answered within ``timeout`` seconds. A refused port, a server
    that accepts and never answers, one that answers 503, or 200 with something that is not a chat
    completion, a mistyped URL or a wrong model name is one :class:`InfrastructureFailure` naming
    the URL and what went wrong, within ``timeout``, where the work's own requests would each be
    retried with backoff for minutes (a refusal of the request itself, a 400, is no such failure)."""
    where = base_url or os.environ.get("OPENAI_BASE_URL") or "no --base-url / $OPENAI_BASE_URL"
    try:
        client = ModelClient(model, base_url=base_url, concurrency=1, max_retries=0, timeout=timeout)
    except ModelError as exc:
        raise InfrastructureFailure(f"the {role} model {model!r}: {exc}; nothing was run or written") from None
    try:
        client.complete(client.request([{"role": "user", "content": "Reply with OK."}], max_tokens=1,
                                       temperature=0.0, channel="worker-deployment" if role == "worker" else role))
    except ModelError as exc:
        if model_failure_kind(exc) == "model_error":
            raise InfrastructureFailure(
                f"the {role} model {model!r} at {where} does not answer ({' '.join(str(exc).split())[:300]}); "
                "nothing was run or written: start the endpoint or fix --base-url / --worker-model") from None
    finally:
        client.close()


def check_signing_key() -> None:
    """The key every session signs with, before any file: a corrupt key or CI secret, or no place
    for a key (no $HOME and a user without a home: :func:`~heldout.evaluators.signing.config_dir`),
    is one line now, not a study left behind; so is a key that does not exist yet and could not be
    made where it goes (the first session makes it): its folder under an unwritable $HOME (a
    read-only home, /proc), found by the first session after the study's files were written."""
    if load_signing_key(create=False) is not None:
        return
    try:
        check_folder(signing_key_path().parent, "the signing key's folder")
    except HeldoutError as exc:
        raise HeldoutError(f"{exc}: set $HOME or $XDG_CONFIG_HOME to a folder of yours, ${KEY_FILE_ENV} to a key "
                           f"file, or pass the key in ${KEY_ENV}; nothing was written") from None


__all__ = ["PREFLIGHT_TIMEOUT", "check_endpoint", "check_infrastructure", "check_signing_key"]
