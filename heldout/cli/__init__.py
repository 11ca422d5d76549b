# PYTHON_ARGCOMPLETE_OK  (tab completion: `heldout completion bash`)
"""The ``heldout`` command: a thin layer over the API, one module per group of commands.

- ``commands.py``: the table, one :class:`~heldout.cli.commands.Command` per sub-command naming the
  functions that wire its arguments and run it, and ``build_parser``, a loop over the table.
- ``__init__.py``: :func:`main`: the stop handlers first (Ctrl-C and SIGTERM are one line and exit
  130 from the start, whatever the process inherited), then dispatch's.
- ``dispatch.py``: :func:`~heldout.cli.dispatch.run_command_line`: parse, check the folders a
  command writes, run it, and answer an error heldout raises on purpose with one clear line (exit 2).
- the groups, each a command's ``<name>_arguments(parser)`` beside its ``cmd_<name>(args) -> int``:
  ``data.py`` (tasks list, data verify/freeze, split build/check), ``evaluate.py`` (eval, score),
  ``study.py`` (run, compare verifiers/arms, protocol generalisation), ``results.py`` (report,
  check, plan, verify, runs query/export, export inspect, bundle), ``ledger.py`` (ledger
  verify/sign, key show/generate), ``leak.py`` (leak scan/ablate), ``demo.py``,
  ``model_server.py`` (serve-model), ``vliw.py`` (vliw simulate), ``completion.py``.
- ``shared.py``: the parser class, argument helpers and flag readers the groups share; the groups
  import one another only through it.

Start-up time: only the standard library and heldout's light modules (contracts, files) load with
the package. Each command imports its modules when it runs, and its ``_arguments`` function
imports what its choices come from; main adds only the invoked command's arguments, so ``heldout
--help`` and ``--version`` import no command's modules at all (perf/cli_start.py), and even the
whole parser loads no numba, scipy, statsmodels, matplotlib or duckdb (tests/test_extension.py).
These function-level imports exist for start-up time alone (and :func:`main`'s, so that the stop
handlers are in place before the imports): nothing in heldout imports the CLI, so no cycle can hide
behind them (tests/test_architecture.py)."""

import signal
import sys


class Stopped(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM (a scheduler's stop) in a command with no stop handler of its own.

    A KeyboardInterrupt, so what cleans up after Ctrl-C (the model client cancelling its requests,
    each ``finally``) does so after both. Its own class, because the bare KeyboardInterrupt of
    Python's handler, raised while a dataclass was being made as a command imported its modules,
    sometimes ended ``python -m heldout`` by SIGINT after main had answered it (exit -2 with the
    line printed: 7 of 165 stops sent in a command's first seconds; none of 130 with this class)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_stops: list[int] = []  # the stop signals main's handler has had during this command


def _raise_stopped(signum: int, frame: object) -> None:
    _stops.append(signum)
    raise Stopped(signum)


def main(argv=None) -> int:
    """The ``heldout`` command line (``argv``, default ``sys.argv[1:]``); its exit code.

    SIGINT and SIGTERM raise :class:`Stopped` while the command runs, whatever the process
    inherited: a command started in the background by a script or a job runner (``cmd &`` without
    job control) inherits SIGINT ignored, and Python then installs no Ctrl-C handler, so a SIGINT
    sent to ``heldout eval`` waiting on a silent endpoint was dropped and it waited on for minutes.
    A command's own handlers (a study's) replace these while it runs; the previous ones come back
    after. The handlers go in before the command's modules are imported: a stop during the imports
    is the same one line (Python's handler made it a traceback)."""
    previous = {}
    _stops.clear()
    try:
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, _raise_stopped)
        except ValueError:
            pass  # not the main thread (main called from a thread of a program): its handlers stay
        from heldout.cli.dispatch import run_command_line
        return run_command_line(argv)
    except Exception:
        if not _stops:
            raise
        # a library that turned the stop into its own error (DuckDB: RuntimeError 'Query interrupted')
        return _interrupted(_stops[0])
    except KeyboardInterrupt as exc:
        return _interrupted(getattr(exc, "signum", signal.SIGINT))
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, which cannot put it back
                signal.signal(sig, handler)


def _interrupted(signum: int) -> int:
    how = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    print(f"heldout: interrupted ({how}): rerun the command to finish it", file=sys.stderr)
    return 130


__all__ = ["Stopped", "main"]
