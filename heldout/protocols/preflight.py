"""What every command that starts or continues a study checks before any file of it is written
(:func:`check_infrastructure`): a refused command writes nothing, and each refusal is one line
within seconds, not a study of zeros."""

from __future__ import annotations

from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import HeldoutError, InfrastructureFailure
from heldout.evaluators.signing import KEY_ENV, KEY_FILE_ENV, load_signing_key, signing_key_path
from heldout.files import check_folder
from heldout.models.probe import check_endpoints
from heldout.protocols.run import Cell, StudyConfig, cell_is_isolated
from heldout.sandbox import SandboxError, require_sandbox


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
    check_endpoints(config.worker_model, config.architect_model, config.base_url)
    untrusted = [c for c in cells if c.method.command or cell_is_isolated(c, config) or kinds[c.task] == "program"]
    if untrusted:
        try:
            require_sandbox()
        except SandboxError as exc:
            raise InfrastructureFailure(f"{untrusted[0].label} runs untrusted code: {exc}; nothing was run or "
                                        "written") from None


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


__all__ = ["check_infrastructure", "check_signing_key"]
