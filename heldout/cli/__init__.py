# PYTHON_ARGCOMPLETE_OK  (tab completion: `heldout completion bash`)
"""The ``heldout`` command: a thin layer over the API, one module per group of commands.

- ``commands.py``: the table, one :class:`~heldout.cli.commands.Command` per sub-command naming the
  functions that wire its arguments and run it, and ``build_parser``, a loop over the table.
- ``dispatch.py``: :func:`main`: parse, check the folders a command writes, run it, and answer an
  error heldout raises on purpose with one clear line (exit 2).
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
These function-level imports exist for start-up time alone: nothing in heldout imports the CLI,
so no cycle can hide behind them (tests/test_architecture.py)."""

from heldout.cli.dispatch import main

__all__ = ["main"]
