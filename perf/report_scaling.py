"""`heldout report` time as a synthetic study grows 1x, 4x, 16x, 64x, 256x cells, and one report
of 10,000 cells (targets: scaling exponent <= 1.1, and the 10,000-cell report under 60 s).

The studies are written through the real Ledger and RunRecord (tests/synthetic_study.py), on
tmpfs when there is one. The figure is the time of the whole command a user runs,
``heldout report RUN_DIR --out OUT`` (collect and verify every run, every table, every figure,
Markdown, HTML and JSON), in a fresh interpreter; the exponent is the slope of log(time)
against log(cells). The reference measured in the same run is ``heldout report`` of the 1x grid,
so the ratio column is how many times the 1x report each size costs.

    python perf/report_scaling.py [--max-factor 256] [--no-10k]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]

from synthetic_study import write_study  # noqa: E402

FACTORS = (1, 4, 16, 64, 256)
BASE = (2, 2, 10)  # tasks x methods x seeds: 40 cells at 1x; a factor multiplies the tasks
TARGET_EXPONENT = 1.1
TARGET_10K_SECONDS = 60.0


def report_seconds(run_dir: Path) -> float:
    out = run_dir.parent / "report"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "heldout.cli", "report", str(run_dir), "--out", str(out)],
                          capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"heldout report failed on {run_dir}: {done.stderr[-1500:]}")
    return seconds


def measure(factors=FACTORS, with_10k: bool = True) -> dict:
    shm = Path("/dev/shm")
    rows = []
    sizes = [(f, (BASE[0] * f, BASE[1], BASE[2])) for f in factors]
    if with_10k:
        sizes.append(("10k", (250, 4, 10)))  # 10,000 cells
    for factor, (tasks, methods, seeds) in sizes:
        root = Path(tempfile.mkdtemp(prefix="heldout-perf-report-", dir=shm if shm.is_dir() else None))
        try:
            write_study(root / "runs", tasks, methods, seeds)
            rows.append({"factor": factor, "cells": tasks * methods * seeds,
                         "seconds": report_seconds(root / "runs")})
        finally:
            shutil.rmtree(root, ignore_errors=True)
    grid = [r for r in rows if r["factor"] != "10k"]
    slope = float(np.polyfit([math.log(r["cells"]) for r in grid], [math.log(r["seconds"]) for r in grid], 1)[0])
    ten_k = next((r["seconds"] for r in rows if r["factor"] == "10k"), None)
    return {"rows": rows, "exponent": slope, "ten_k_seconds": ten_k, "reference_seconds": grid[0]["seconds"]}


def figures(with_10k: bool = True) -> list[dict]:
    """Rows for perf/run_all.py: the scaling exponent, and the 10,000-cell report's time."""
    result = measure(FACTORS, with_10k)
    sizes = ", ".join(f"{r['cells']}: {r['seconds']:.1f} s" for r in result["rows"] if r["factor"] != "10k")
    rows = [{"name": "heldout report, 40 -> 10,240 cells", "value": result["exponent"], "unit": "",
             "ratio": result["exponent"], "target": f"scaling exponent <= {TARGET_EXPONENT}",
             "passed": result["exponent"] <= TARGET_EXPONENT, "note": sizes}]
    if result["ten_k_seconds"] is not None:
        rows.append({"name": "heldout report, 10,000 cells", "value": result["ten_k_seconds"], "unit": "s",
                     "ratio": result["ten_k_seconds"] / result["reference_seconds"],
                     "target": f"<= {TARGET_10K_SECONDS:g} s", "passed": result["ten_k_seconds"] <= TARGET_10K_SECONDS,
                     "note": f"ratio = x the 40-cell report of the same run ({result['reference_seconds']:.1f} s)"})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-factor", type=int, default=256)
    parser.add_argument("--no-10k", action="store_true", help="skip the 10,000-cell report")
    args = parser.parse_args(argv)
    result = measure(tuple(f for f in FACTORS if f <= args.max_factor), not args.no_10k)
    ref = result["reference_seconds"]
    print(f"{'size':>6} {'cells':>7} {'seconds':>9} {'x 1x':>7}")
    for r in result["rows"]:
        print(f"{str(r['factor']):>6} {r['cells']:>7} {r['seconds']:>9.2f} {r['seconds'] / ref:>7.1f}")
    ok = result["exponent"] <= TARGET_EXPONENT
    print(f"scaling exponent {result['exponent']:.2f} (target <= {TARGET_EXPONENT}): {'pass' if ok else 'FAIL'}")
    if result["ten_k_seconds"] is not None:
        ok10 = result["ten_k_seconds"] <= TARGET_10K_SECONDS
        ok = ok and ok10
        print(f"10,000-cell report {result['ten_k_seconds']:.1f} s (target <= {TARGET_10K_SECONDS:g} s): "
              f"{'pass' if ok10 else 'FAIL'}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
