"""Running untrusted code: an allow-list bubblewrap root, fresh namespaces, whole-run cgroup
limits, time limits in CPU time measured from outside (wall time only as a backstop). Programs
cross the boundary as files; results come back as JSON lines that the parent checks (see
:mod:`heldout.sandbox.process`). By default an execution is forked by a per-preload-set fork
server started inside the same sandbox (:mod:`heldout.sandbox.zygote`), at the same isolation."""

from heldout.contracts import wall_backstop
from heldout.sandbox.monitor import decode_typed
from heldout.sandbox.process import (
    CANDIDATE_KINDS,
    PROGRAM_PRELOAD,
    STDLIB_PRELOAD,
    ERROR_KINDS,
    NoSandbox,
    SandboxError,
    SandboxResult,
    allow_unsafe_no_sandbox,
    isolation_level,
    isolation_mode,
    require_sandbox,
    run_calls,
    run_function,
    unsafe_allowed,
)

__all__ = ["CANDIDATE_KINDS", "PROGRAM_PRELOAD", "STDLIB_PRELOAD", "ERROR_KINDS", "NoSandbox", "SandboxError",
           "SandboxResult", "allow_unsafe_no_sandbox", "decode_typed", "isolation_level", "isolation_mode",
           "require_sandbox", "run_calls", "run_function", "unsafe_allowed", "wall_backstop"]
