"""What the command groups share, and the only module they share: the parser class with one-line
errors, the argument helpers several groups use, JSON printing, and the readers of flags that
several groups take (trusted signers, optimizer trust, run dirs, a local model)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from heldout.contracts import HeldoutError, json_safe

if TYPE_CHECKING:  # annotations only
    from heldout.evaluators.signing import TrustedSigners
    from heldout.models.backends.llama import LlamaBackend

# Start-up time: like the commands, the readers below import their modules when called, so that
# building the parser loads none of them (heldout/cli/__init__.py, perf/cli_start.py).


def print_json(obj: Any) -> None:
    print(json.dumps(json_safe(obj), indent=None, default=str, allow_nan=False))


def command_line(args: argparse.Namespace) -> str:
    """The command as typed (for a resume hint): ``heldout`` and its arguments, shell-quoted."""
    return "heldout " + " ".join(shlex.quote(a) for a in (args.argv or sys.argv[1:]))


class HeldoutParser(argparse.ArgumentParser):
    """argparse with one-line errors (``heldout run: error: ...``), like every other heldout error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if "--task" in args:
            action.completer = complete_task_names  # what argcomplete offers: task names, not file names
        return action


def complete_task_names(prefix: str, **_: Any) -> list[str]:
    """Task names and groups starting with ``prefix`` (the shell's completion of ``--task``)."""
    from heldout.benchmarks.registry import all_tasks, task_groups
    names = sorted({bench.name for bench in all_tasks()} | set(task_groups()))
    return [name for name in names if name.startswith(prefix)]


def number(kind: Callable[[str], Any], low: float, what: str, *, strict: bool = False, high: float | None = None):
    """An argparse type: a ``kind`` number >= ``low`` (> with ``strict``), < ``high`` when given."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        ok = value is not None and math.isfinite(value) and (value > low if strict else value >= low) \
            and (high is None or value < high)
        if not ok:
            bound = f"{'>' if strict else '>='} {low:g}" + (f" and < {high:g}" if high is not None else "")
            raise argparse.ArgumentTypeError(f"{what} must be a {'whole ' if kind is int else ''}number {bound}, "
                                             f"got {text!r}")
        return value
    return parse


DATA_DIR_HELP = "local data mirror laid out like ../shared/data (default $HELDOUT_DATA_DIR, else the hub)"


def add_data_dir(p: argparse.ArgumentParser, help: str = DATA_DIR_HELP) -> None:
    p.add_argument("--data-dir", default=None, help=help)


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="default", help="split profile (default: default)")


def add_allow_drift(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-drift", action="store_true",
                   help="load even if the data drifted from its manifest (stated in the record)")


def add_optimizer_by_name(p: argparse.ArgumentParser, required: bool = True) -> None:
    """The one optimizer of a protocol command, and whether it may run in the harness's process."""
    p.add_argument("--optimizer", required=required, help="reference name or NAME=module:function (isolated "
                   "unless --trusted-optimizer)")
    p.add_argument("--trusted-optimizer", action="store_true",
                   help="run a module:function optimizer in the harness's process (recorded as 'trusted, not isolated')")


def add_session_environment(p: argparse.ArgumentParser, *, tolerance: bool = True, drift: bool = True) -> None:
    """The options every command that runs sessions shares: models, endpoint, cache and data."""
    p.add_argument("--worker-model", default=None, help="model id of the worker (prompt tasks)")
    p.add_argument("--architect-model", default=None, help="model id of the metered architect")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)")
    p.add_argument("--cache-dir", default=None, help="response cache directory")
    if tolerance:
        p.add_argument("--tolerance", type=float, default=None, help="geometry tasks: constraint tolerance (default 0)")
    add_data_dir(p)
    if drift:
        add_allow_drift(p)


def optimizer_trusted(args: argparse.Namespace) -> bool:
    """Whether the person running the command trusts its user code to run in the harness's process
    (``--trusted-optimizer`` or ``HELDOUT_TRUSTED_OPTIMIZER=1``); a file never grants it."""
    from heldout.protocols.study import trust_granted
    return trust_granted(getattr(args, "trusted_optimizer", False))


def add_trusted_signers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trusted-signers", action="append", default=[], metavar="FILE",
                   help="a file of trusted signers, 'NAME PUBLIC-KEY-OR-FINGERPRINT' a line (repeatable); with "
                        "neither this nor --trust-key, only this machine's own signing key is trusted")
    p.add_argument("--trust-key", action="append", default=[], metavar="[NAME=]KEY",
                   help="trust this public key (ed25519:...) or fingerprint (SHA256:...) (repeatable)")


def trusted_signers(args: argparse.Namespace) -> TrustedSigners:
    from heldout.evaluators.signing import TrustedSigners
    return TrustedSigners.resolve(args.trusted_signers, args.trust_key)


def require_run_dirs(paths: Sequence[str]) -> None:
    """A mistyped run dir is answered before the reports and their statistics are imported (~2 s)."""
    for path in paths:
        if not Path(path).exists():
            raise HeldoutError(f"run dir {path} does not exist")


def add_local_model_arguments(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", default=None, help="a bundled model (default: smollm2-135m-instruct)")
    which.add_argument("--gguf", default=None, help="any GGUF chat model file instead")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for the model")
    p.add_argument("--ctx", type=int, default=2048, help="context length in tokens")


def local_backend(args: argparse.Namespace, max_tokens_cap: int) -> LlamaBackend:
    """The local model ``add_local_model_arguments`` chose (``serve-model``, ``demo``)."""
    from heldout.models.backends.llama import LlamaBackend, resolve_model
    return LlamaBackend(resolve_model(args.model, args.gguf), threads=args.threads, n_ctx=args.ctx,
                        max_tokens_cap=max_tokens_cap)


@contextlib.contextmanager
def calling_on_stop(interrupt: Callable[[], None]):
    """While the block runs, a stop (SIGINT, SIGTERM) also calls ``interrupt`` at once, from a
    thread of its own. Python runs a signal's handler between the main thread's bytecodes only,
    and a long call into a library's C code returns when it is done: Ctrl-C of ``runs query`` in a
    long query waited for DuckDB to look (17 s in one run) and then ended in its RuntimeError's
    traceback; DuckDB's ``interrupt()`` stops the query now, and :func:`heldout.cli.main` answers
    the stop. Main thread only (elsewhere the block just runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)  # written by the signal's C handler

    def watch() -> None:
        while signum := os.read(read, 1):  # the number of each signal that came (empty: the block ended)
            if signum[0] in (signal.SIGINT, signal.SIGTERM):
                interrupt()
                return

    watcher = threading.Thread(target=watch, name="heldout-stop-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write)
        watcher.join(timeout=10)
        os.close(read)
