"""Sandboxed evaluations per second of a trivial valid program, against a bare subprocess.

Measured in the same run: (a) ``python -c pass`` started with ``subprocess.run`` (the floor any
process-per-evaluation design pays), (b) ``run_function`` on a trivial program (fresh scratch dir,
namespaces, mounts, uid drop, rlimits, result channel), (c) the same through a geometry task's full
path (sandbox + numpy import + scoring). Printed: evaluations per second of each and the ratios
sandbox / bare (the sandbox's overhead factor).

    python perf/sandbox_throughput.py [--n 100]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from heldout.contracts import RunLimits
from heldout.benchmarks.registry import get_benchmark
from heldout.sandbox import isolation_mode, run_function

LIMITS = RunLimits(wall_seconds=30, cpu_seconds=30, memory_mb=1024)


def rate(n: int, fn) -> float:
    fn()  # warm-up (isolation probe, page cache)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def figures(n: int = 20) -> list[dict]:
    """Rows for perf/run_all.py: seconds per sandboxed execution of a trivial program against the
    issue-19 target of 10 ms (pending the allow-list sandbox and its fork server), bare
    ``python -c pass`` alongside."""
    r_bare = rate(n, lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))

    def sandboxed() -> None:
        r = run_function({"program.py": "def f():\n    return 1\n"}, "program", "f", limits=LIMITS)
        assert r.ok and r.value == 1, r

    per = 1 / rate(n, sandboxed)
    return [{"name": f"sandbox start: one sandboxed execution ({isolation_mode()})", "value": per, "unit": "s",
             "ratio": per / 0.010, "target": "<= 10 ms (PENDING sandbox rewrite)", "passed": per <= 0.010,
             "note": f"bare python -c pass {1 / r_bare:.3f} s; {per * r_bare:.2f}x of it"}]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    n = ap.parse_args().n

    def bare() -> None:
        subprocess.run([sys.executable, "-c", "pass"], check=True)

    def sandboxed() -> None:
        r = run_function({"program.py": "def f():\n    return 1\n"}, "program", "f", limits=LIMITS)
        assert r.ok and r.value == 1, r

    bench = get_benchmark("circle_packing/square26")
    seed, example = bench.seed_candidate(), bench.load_raw(None)[0]

    def task() -> None:
        v = bench.run(seed, example, bench.context(LIMITS))
        assert v.valid, v.error

    r_bare, r_sbx, r_task = rate(n, bare), rate(n, sandboxed), rate(max(1, n // 2), task)
    print(f"isolation mode: {isolation_mode()}")
    print(f"bare `python -c pass`:            {r_bare:8.1f} /s")
    print(f"sandboxed trivial program:        {r_sbx:8.1f} /s   ratio sandbox/bare time = {r_bare / r_sbx:.2f}x")
    print(f"circle_packing/square26 seed run: {r_task:8.1f} /s   ratio task/bare time = {r_bare / r_task:.2f}x")


if __name__ == "__main__":
    main()
