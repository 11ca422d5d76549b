"""Results-store build time as a synthetic study grows 1x, 4x, 16x, 256x cells (40 to 10,240
cells; target: linear or better). The studies are written through the real Ledger and RunRecord
(tests/synthetic_study.py), on tmpfs when there is one; the figure is the time of
``ResultsStore.open`` (find, verify every ledger and record, load DuckDB), and the scaling
exponent is the slope of log(time) against log(cells) over the 4 sizes (1.0 = linear).

    python perf/store_build.py [--base 40] [--max-factor 256]
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]

from heldout.reports.store import ResultsStore  # noqa: E402
from synthetic_study import write_study  # noqa: E402

FACTORS = (1, 4, 16, 256)
TARGET_EXPONENT = 1.1  # linear, with room for noise on a shared machine


def measure(base_seeds: int = 5, factors=FACTORS) -> list[dict]:
    """Base grid: 2 tasks x 4 methods x ``base_seeds`` seeds; factor f multiplies the seeds."""
    shm = Path("/dev/shm")
    out = []
    for factor in factors:
        root = Path(tempfile.mkdtemp(prefix="heldout-perf-store-", dir=shm if shm.is_dir() else None))
        try:
            truth = write_study(root, 2, 4, base_seeds * factor, failed_every=50)
            t0 = time.perf_counter()
            store = ResultsStore.open([root])
            seconds = time.perf_counter() - t0
            t0 = time.perf_counter()
            store.query("SELECT task, method, avg(test_score) FROM runs GROUP BY ALL").rows
            query_s = time.perf_counter() - t0
            assert store.count("runs") == len(truth)
            out.append({"factor": factor, "cells": len(truth), "build_s": seconds, "query_s": query_s})
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return out


def exponent(points: list[dict]) -> float:
    return float(np.polyfit(np.log([p["cells"] for p in points]), np.log([p["build_s"] for p in points]), 1)[0])


def figures(base_seeds: int = 5) -> list[dict]:
    """Rows for perf/run_all.py: build time at the largest size, and the scaling exponent."""
    points = measure(base_seeds)
    slope = exponent(points)
    sizes = ", ".join(f"{p['cells']}: {p['build_s']:.2f} s" for p in points)
    largest = points[-1]
    return [{"name": f"results store build ({largest['cells']} cells)", "value": largest["build_s"], "unit": "s",
             "ratio": slope, "target": f"exponent <= {TARGET_EXPONENT} (linear)", "passed": slope <= TARGET_EXPONENT,
             "note": f"{sizes}; query {largest['query_s'] * 1000:.0f} ms"}]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-seeds", type=int, default=5)
    args = parser.parse_args()
    points = measure(args.base_seeds)
    for p in points:
        print(f"{p['factor']:>4}x {p['cells']:>6} cells: build {p['build_s']:7.2f} s "
              f"({p['build_s'] / p['cells'] * 1000:.2f} ms/cell), query {p['query_s'] * 1000:.1f} ms")
    print(f"scaling exponent {exponent(points):.2f} (1.0 = linear; target <= {TARGET_EXPONENT})")
