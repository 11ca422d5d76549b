"""Running untrusted code: a separate process tree with limits, no network and a scrubbed view of
the file system. Programs cross the boundary as files; results come back as JSON lines that the
parent checks (see :mod:`heldout.sandbox.process`)."""

from heldout.sandbox.process import (
    ERROR_KINDS,
    SandboxError,
    SandboxResult,
    decode_typed,
    isolation_mode,
    run_calls,
    run_function,
)

__all__ = ["ERROR_KINDS", "SandboxError", "SandboxResult", "decode_typed", "isolation_mode",
           "run_calls", "run_function"]
