"""``run_command_line``: parse the command line with only the invoked command's arguments, check
every folder the command will write, run it, and answer an error heldout raises on purpose (or a
path it cannot use, or a full disk) with one line and exit 2."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import Sequence

from heldout.cli.commands import build_parser, command_words
from heldout.contracts import HeldoutError
from heldout.files import check_folder


@contextlib.contextmanager
def _working_directory_off_the_path():
    """The command runs with the working directory off ``sys.path`` (``PYTHONPATH=.`` or ``""``
    put it there): the modules the harness imports lazily (a library's ``typing_extensions``,
    ``sniffio``, ``gepa``) must never come from the user's folder. User code is found there by
    path (:func:`heldout.optimizers.user_modules.search_path`), never imported from it."""
    saved = list(sys.path)
    cwd = os.path.realpath(os.getcwd())
    sys.path[:] = [entry for entry in saved if entry != "" and os.path.realpath(entry) != cwd]
    try:
        yield
    finally:
        sys.path[:] = saved


def _stdout_that_prints_any_text() -> None:
    """Under a locale whose encoding is not UTF-8 (``LC_ALL=en_US.ISO-8859-1``, ``PYTHONUTF8=0
    LC_ALL=C``), a character it cannot encode (a model's arrow, a CJK option) in a table or a query's
    rows made ``print`` raise, ending the command with a traceback after its work was done; such a
    character is printed escaped instead (``\\u2192``), as Python already prints it on stderr."""
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    if encoding not in ("utf8", "utf8sig") and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")


def run_command_line(argv: Sequence[str] | None = None) -> int:
    """The command ``argv`` names (default ``sys.argv[1:]``), run; its exit code. A stop (Ctrl-C,
    SIGTERM) passes through as a KeyboardInterrupt, which :func:`heldout.cli.main` answers."""
    _stdout_that_prints_any_text()
    with _working_directory_off_the_path():
        return _main(argv)


def _main(argv: Sequence[str] | None = None) -> int:
    given = list(argv) if argv is not None else sys.argv[1:]
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions, which need every command's arguments
        parser = build_parser()
        try:
            import argcomplete
        except ImportError:  # the optional extra heldout[completion]: parse as if no shell asked
            pass
        else:
            argcomplete.autocomplete(parser)  # answers the shell's completion request and exits
    else:
        parser = build_parser(command_words(given))
    args = parser.parse_args(argv)
    args.argv = given
    if args.unsafe_no_sandbox:  # the sandbox's modules load only when asked for (start-up time)
        from heldout.sandbox import allow_unsafe_no_sandbox
        allow_unsafe_no_sandbox()
    try:
        for dest in args.writes:
            if getattr(args, dest, None) is not None:
                check_folder(getattr(args, dest), f"--{dest.replace('_', '-')}")
        return int(args.func(args) or 0)
    except HeldoutError as exc:
        if args.verbosity > 0:
            import traceback  # only here: 3 ms of every start otherwise
            traceback.print_exc(file=sys.stderr)
        print(f"heldout: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a full disk outside the ledger (a run record, a study file): one line too
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            if not exc.filename:
                raise
            # a path the checks before the command could not foresee (it changed meanwhile, or a
            # pseudo file system): still one line, never a traceback (-v prints it)
            if args.verbosity > 0:
                import traceback
                traceback.print_exc(file=sys.stderr)
            print(f"heldout: error: cannot use {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        where = f" (writing {exc.filename})" if exc.filename else ""
        print(f"heldout: error: no space left on device{where}: free space, then rerun the same command (with "
              "--resume once the study has started)", file=sys.stderr)
        return 2
