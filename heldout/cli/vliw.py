"""``heldout vliw simulate``: the VLIW kernel simulator on conformance cases."""

from __future__ import annotations

import argparse

from heldout.cli.shared import print_json

# Start-up time: the command imports its modules when it runs, so the parser loads none of them
# (heldout/cli/__init__.py).


def vliw_simulate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("cases", help="CASES.json: a list of {name, program, mem[, scratch_init, enable_pause, runs]}")
    p.add_argument("--engine", choices=("fast", "reference"), default="fast", help="simulator engine")
    p.add_argument("--cycle-cap", type=int, default=10_000_000, help="stop a program after this many cycles")


def cmd_vliw_simulate(args: argparse.Namespace) -> int:
    from heldout.benchmarks.vliw.conformance import load_cases, run_case
    for case in load_cases(args.cases):
        print_json(run_case(case, engine=args.engine, cycle_cap=args.cycle_cap))
    return 0
