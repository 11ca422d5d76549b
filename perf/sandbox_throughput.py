"""Per-execution overhead of the sandbox: the fork server against a fresh sandbox and a bare
subprocess, all measured in the same run.

(a) ``python -c pass`` started with ``subprocess.run`` (the floor of any process-per-execution
design), (b) ``run_function`` on a trivial program in a fresh sandbox (bwrap, a new interpreter,
the child's setup), (c) the same forked by the fork server (same isolation: own namespaces,
cgroup, scratch tmpfs, uid, seccomp), (d) a geometry task's full path (fork server + scoring).
Printed: seconds per execution and the ratios. The issue-19 target is <= 10 ms per forked
execution; on a loaded machine every process start is slower, so the ratio against the bare
``python -c pass`` of the same run is printed alongside.

    python perf/sandbox_throughput.py [--n 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from heldout.contracts import RunLimits
from heldout.benchmarks.registry import get_benchmark
from heldout.sandbox import PROGRAM_PRELOAD, isolation_level, run_function, zygote

LIMITS = RunLimits(wall_seconds=30, cpu_seconds=30, memory_mb=1024)
PROGRAM = {"program.py": "def f():\n    return 1\n"}
TARGET_SECONDS = 0.010


def seconds_each(n: int, fn) -> float:
    fn()  # warm-up (isolation probe, fork server start, page cache)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def bare() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def trivial(fork_server: bool):
    def run() -> None:
        r = run_function(PROGRAM, "program", "f", limits=LIMITS, preload=PROGRAM_PRELOAD, fork_server=fork_server)
        assert r.ok and r.value == 1 and r.forked == fork_server, r
    return run


def measure(n: int) -> dict[str, float]:
    """Seconds per execution: bare, fresh sandbox, forked (interleaved in rounds, so that a
    change of load affects all three alike)."""
    totals = {"bare": 0.0, "fresh": 0.0, "forked": 0.0}
    fns = {"bare": bare, "fresh": trivial(False), "forked": trivial(True)}
    for fn in fns.values():
        fn()
    rounds = max(1, n // 10)
    for _ in range(rounds):
        for name, fn in fns.items():
            k = 10 if name == "forked" else 3
            start = time.perf_counter()
            for _ in range(k):
                fn()
            totals[name] += (time.perf_counter() - start) / k
    return {name: t / rounds for name, t in totals.items()}


TARGET_RATIO = 0.25  # issue 38: a forked execution <= a quarter of a bare interpreter start, same run


def samples(forked: int = 200, bare_each: int = 5) -> dict[str, list[float]]:
    """Seconds of each single execution: ``forked`` trivial forked executions and one bare
    ``python -c pass`` per ``bare_each`` of them, interleaved (a change of load hits both alike)."""
    run_forked = trivial(True)
    run_forked()
    bare()
    out: dict[str, list[float]] = {"forked": [], "bare": []}
    for k in range(forked):
        for name, fn in (("forked", run_forked),) + ((("bare", bare),) if k % bare_each == 0 else ()):
            start = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - start)
    return out


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def figures(n: int = 200) -> list[dict]:
    """Rows for perf/run_all.py: a forked execution of a trivial program at p50 and p95 over
    ``n`` executions, each as a ratio to bare ``python -c pass`` at the same quantile in the
    same run (target <= 0.25x); the absolute 10 ms of issue 19 is in the note."""
    if not zygote.fork_server_enabled():
        return [{"name": "sandbox start: forked execution", "value": float("nan"), "unit": "s", "ratio": float("nan"),
                 "target": f"<= {TARGET_RATIO}x bare", "passed": False, "note": "the fork server is not available here"}]
    got = samples(n)
    load = os.getloadavg()[0]
    rows = []
    for q in (0.5, 0.95):
        forked, base = quantile(got["forked"], q), quantile(got["bare"], q)
        rows.append({"name": f"sandbox start: forked execution p{round(q * 100)} ({isolation_level()})",
                     "value": forked, "unit": "s", "ratio": forked / base, "target": f"<= {TARGET_RATIO}x bare python",
                     "passed": forked / base <= TARGET_RATIO,
                     "note": f"bare python -c pass p{round(q * 100)} {base * 1000:.1f} ms over {len(got['bare'])}; "
                             f"forked {forked * 1000:.1f} ms over {len(got['forked'])} (issue 19's fixed 10 ms: "
                             f"{'met' if forked <= TARGET_SECONDS else 'missed'}); load {load:.1f}"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    n = ap.parse_args().n
    t = measure(n)
    bench = get_benchmark("circle_packing/square26")
    seed, example = bench.seed_candidate(), bench.load_raw(None)[0]

    def task() -> None:
        v = bench.run(seed, example, bench.context(LIMITS))
        assert v.valid, v.error

    t_task = seconds_each(max(1, n // 2), task)
    print(f"isolation: {isolation_level()}; fork server: {'on' if zygote.fork_server_enabled() else 'off'}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"bare `python -c pass`:              {t['bare'] * 1000:8.1f} ms")
    print(f"fresh sandbox, trivial program:     {t['fresh'] * 1000:8.1f} ms   {t['fresh'] / t['bare']:.2f}x bare")
    print(f"fork server, trivial program:       {t['forked'] * 1000:8.1f} ms   {t['forked'] / t['bare']:.2f}x bare, "
          f"{t['fresh'] / t['forked']:.1f}x faster than fresh (target <= 10 ms)")
    print(f"circle_packing/square26 seed run:   {t_task * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
