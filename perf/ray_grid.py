"""The same CPU-bound program-task grid on the local executor (serial, one process) and on Ray
with 2 workers: wall seconds of each and the speedup (issue 18's target: >= 1.8x over serial).

The grid: ``circle_packing/square26`` x ``local-search`` x 4 seeds (each cell runs its candidates
in the sandbox: CPU-bound, no model; 120 metric calls, a few seconds of work per cell). Ray's
start-up is not in the figure (a cluster is started once per study, not per cell), and the serial
process and every Ray worker are warmed up on the same throw-away grid first. The serial grid
runs before and after the Ray grid, and its figure is the mean of the two, so that a change of
the machine's speed during the run (ours swings by up to 2x within minutes) does not favour
either side. Records of both runs are compared: same test scores.

    python perf/ray_grid.py [--seeds 4] [--budget 120]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from heldout.protocols.executors import RayExecutor  # noqa: E402
from heldout.protocols.run import LocalExecutor, StudyConfig, build_cells, run_study  # noqa: E402
from heldout.protocols.study import parse_methods  # noqa: E402

TASK = "circle_packing/square26"
TARGET = 1.8


def _grid(seeds: int, budget: int, first_seed: int = 0):
    return build_cells([TASK], parse_methods(["local-search"], []), list(range(first_seed, first_seed + seeds)),
                       {TASK: budget}, "default", {})


def measure(seeds: int = 4, budget: int = 120) -> dict:
    import ray

    root = Path(tempfile.mkdtemp(prefix="heldout-perf-ray-"))
    try:
        cells = _grid(seeds, budget)

        def run_serial(name: str) -> tuple[list, float]:
            t0 = time.perf_counter()
            records = run_study(cells, StudyConfig(run_root=str(root / name)), LocalExecutor(1), progress=False)
            return records, time.perf_counter() - t0

        # warm as the Ray workers will be (imports, fork server), on the same throw-away grid
        run_study(_grid(4, 10, first_seed=100), StudyConfig(run_root=str(root / "serial-warm")), LocalExecutor(1),
                  progress=False)
        serial, first_s = run_serial("serial")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 2**20,
                 runtime_env={"env_vars": {"PYTHONPATH": str(HERE.parent)}})
        try:
            # every worker warm (imports, fork server): cells long enough that one worker cannot
            # take them all while the other is still starting
            warm = _grid(4, 10, first_seed=100)
            run_study(warm, StudyConfig(run_root=str(root / "warm")), RayExecutor(root / "warm"), progress=False)
            t0 = time.perf_counter()
            distributed = run_study(cells, StudyConfig(run_root=str(root / "ray")), RayExecutor(root / "ray"),
                                    progress=False)
            ray_s = time.perf_counter() - t0
        finally:
            ray.shutdown()
        _, second_s = run_serial("serial-again")
        serial_s = (first_s + second_s) / 2
        same = sorted((r["seed"], r["test_score"]) for r in serial) == sorted((r["seed"], r["test_score"]) for r in distributed)
        return {"serial_s": serial_s, "serial_runs": [first_s, second_s], "ray_s": ray_s, "speedup": serial_s / ray_s,
                "same_scores": same, "cells": len(cells)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def figures(seeds: int = 4, budget: int = 120) -> list[dict]:
    """Row for perf/run_all.py."""
    got = measure(seeds, budget)
    return [{"name": f"ray grid speedup ({got['cells']} cells, 2 workers)", "value": got["ray_s"], "unit": "s",
             "ratio": got["speedup"], "target": f">= {TARGET}x over serial ({got['serial_s']:.1f} s)",
             "passed": got["speedup"] >= TARGET and got["same_scores"],
             "note": f"serial {' and '.join(f'{s:.1f}' for s in got['serial_runs'])} s before and after Ray; "
                     + ("same test scores" if got["same_scores"] else "TEST SCORES DIFFER")}]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--budget", type=int, default=120)
    args = parser.parse_args()
    got = measure(args.seeds, args.budget)
    print(f"{got['cells']} cells: serial {got['serial_s']:.2f} s (runs {got['serial_runs'][0]:.2f} and "
          f"{got['serial_runs'][1]:.2f} s), Ray (2 workers) {got['ray_s']:.2f} s, "
          f"speedup {got['speedup']:.2f}x (target >= {TARGET}x); same test scores: {got['same_scores']}")
