"""One decided value per method of a study: what runs, from which code, how trusted.

A study's cell is launched, described and recorded from a :class:`ResolvedMethod` made once
(:func:`resolve_method`, when the study is made): the ``module:function`` target, the options the
function receives, the user's modules found by path (nothing of them run) and the hash of their
code, whether the code is the user's, and whether the person running the command trusted it. The
modules that launch a cell (the runner, the isolated launcher, the executors) read it instead of
asking :mod:`heldout.optimizers` again, so the file is read and hashed once and the answer
cannot differ between the check, the launch and the record."""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from heldout.optimizers.loading import target_code_sha256, user_modules
from heldout.optimizers.registry import optimizer_target
from heldout.optimizers.specs import is_reference_optimizer, split_spec, user_code
from heldout.optimizers.user_modules import UserModule

ISOLATED = "isolated"
TRUSTED = "in-process (trusted)"


@dataclass(frozen=True)
class ResolvedMethod:
    """A method as it will run. ``spec`` is what the person named (a reference name, a plugin's
    name, ``module:function``, options after ``?``); ``target`` its ``module:function`` (None for
    a command); ``options`` what the function receives (the spec's and the method's, the
    method's winning); ``modules`` the user's code found by path; ``user_code`` whether any of it
    is the user's rather than heldout's; ``trusted`` whether the person granted trust
    (``--trusted-optimizer``, ``HELDOUT_TRUSTED_OPTIMIZER=1``)."""

    name: str
    spec: str | None
    target: str | None
    command: str | None
    options: dict[str, Any] = field(default_factory=dict)
    method_options: dict[str, Any] = field(default_factory=dict)
    code_sha256: str | None = None
    modules: tuple[UserModule, ...] = ()
    user_code: bool = False
    trusted: bool = False

    @property
    def isolated(self) -> bool:
        """Commands and user code run isolated unless the person trusted it; heldout's own
        reference optimizers run in-process."""
        return bool(self.command) or (self.user_code and not self.trusted)

    @property
    def isolation(self) -> str:
        return ISOLATED if self.isolated else TRUSTED

    def code_changed(self) -> str | None:
        """Why the code on disk is no longer the code decided (hashed) when the study was made, or
        None when it is the same: a cell about to run says so instead of recording a hash of code
        that is not the code it runs."""
        if self.command:
            now = command_sha256(self.command)
        else:
            named = optimizer_target(self.spec)  # an in-process run loads what the name names now
            if named != self.target:
                return (f"the optimizer {self.name!r} now names {named}, not {self.target} as when the study was "
                        "made: this cell did not run; start a new study for the new code")
            now = target_code_sha256(self.spec, named, user_code(self.spec, self.method_options))
        if now == self.code_sha256:
            return None
        return (f"the optimizer's code changed after the study was made (sha256 {str(self.code_sha256)[:12]} "
                f"decided, {str(now)[:12]} on disk now): this cell did not run; start a new study for the new code")

    def describe(self) -> dict[str, Any]:
        """What a run record says of the method: its name, what ran (target and options, or the
        command) and the hash of that code."""
        if self.command:
            return {"name": self.name, "command": self.command, "code_sha256": self.code_sha256}
        return {"name": self.name, "target": self.target, "options": dict(self.options),
                "code_sha256": self.code_sha256}


def resolve_method(name: str, target: str | None = None, command: str | None = None,
                   options: Mapping[str, Any] | None = None, *, trusted: bool = False) -> ResolvedMethod:
    """Decide what method ``name`` runs (see :class:`ResolvedMethod`), reading and hashing its code
    once, running none of it."""
    options = dict(options or {})
    if command:
        return ResolvedMethod(name=name, spec=None, target=None, command=command, code_sha256=command_sha256(command),
                              user_code=True, trusted=trusted)
    spec = target or name
    decided = optimizer_target(spec)
    return ResolvedMethod(
        name=name, spec=spec, target=decided, command=None,
        options={**split_spec(spec)[1], **options}, method_options=options,
        code_sha256=target_code_sha256(spec, decided, user_code(spec, options)), modules=tuple(user_modules(spec, options)),
        user_code=not is_reference_optimizer(spec) or bool(user_code(spec, options)), trusted=trusted)


def command_sha256(command: str) -> str:
    """sha256 of a command line and of the files its words name."""
    digest = hashlib.sha256(command.encode())
    for part in shlex.split(command):
        if os.path.isfile(part):
            digest.update(Path(part).read_bytes())
    return digest.hexdigest()
