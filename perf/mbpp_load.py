"""MBPP+ verdicts idle and with both cores saturated: agreement, and each pass's wall time.

issue 53: time limits used to be wall time, so beside other work a correct solution could time
out (Mbpp/599's canonical solution failed its own plus suite beside 8 other sandboxed checks). The
limits are now CPU time of the candidate's whole process tree, read by the sandbox's parent, with
a wall backstop 4x + 2 s of each limit; this script shows what that buys on real problems.

The samples: the canonical solutions of the slowest problems (Mbpp/599, /392, /255: their
canonical solutions' CPU time over all inputs is 22.6, 4.0 and 3.8 s here), of the first
``--first`` problems, and a Mbpp/599 solution doing its canonical work 8 times over (too slow: it
must time out, both times). Expected outputs are computed first (and cached), so both timed passes
are the same checks: one idle, one beside ``--sandboxed`` sandboxed executions computing back to
back and ``--plain`` plain CPU-bound processes (started by this script, stopped when the pass
ends, and never older than 15 minutes).

Printed: the verdicts of each pass and whether they agree (they must: the row's target), each
pass's wall time and their ratio (loaded / idle: how far the load stretched wall time, which the
verdicts no longer feel), the machine's fixed loop and load average.

    python perf/mbpp_load.py [--data-dir ../shared/data] [--workers 2] [--first 20] [--sandboxed 3] [--plain 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE.parent / "tests")]  # heldout, sibling scripts, the load

from heldout.benchmarks.mbpp_plus.execution import check_many, load_problems  # noqa: E402
from heldout.contracts import RunLimits  # noqa: E402
from machine import fixed_loop_seconds, verdict  # noqa: E402
from machine_load import MachineLoad  # noqa: E402

SLOWEST = ("Mbpp/599", "Mbpp/392", "Mbpp/255")
TOO_SLOW_599 = ("def sum_average(number):\n    for _ in range(8):\n        total = sum(range(1, number + 1))\n"
                "    return total, total / number\n")
LIMITS = RunLimits(wall_seconds=60, cpu_seconds=60, memory_mb=4096)


def samples(data_dir: str, first: int) -> list[tuple[dict, str, str]]:
    """(problem, code, label) of every sample."""
    problems = load_problems(Path(data_dir) / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl")
    by_id = {p["task_id"]: p for p in problems}
    chosen = list(SLOWEST) + [p["task_id"] for p in problems[:first] if p["task_id"] not in SLOWEST]
    out = [(by_id[t], by_id[t]["prompt"] + by_id[t]["canonical_solution"], t) for t in chosen]
    return out + [(by_id["Mbpp/599"], TOO_SLOW_599, "Mbpp/599 too slow (8x its work)")]


def verdicts(items: list[tuple[dict, str, str]], workers: int) -> tuple[list[tuple], float]:
    start = time.perf_counter()
    results = check_many([(p, code) for p, code, _ in items], workers=workers, limits=LIMITS)
    seconds = time.perf_counter() - start
    out = []
    for r in results:
        fail = r.first_failure() or {}
        out.append((r.base_pass, r.plus_pass, fail.get("suite"), fail.get("index"), fail.get("reason")))
    return out, seconds


def measure(data_dir: str, workers: int = 2, first: int = 20, sandboxed: int = 3, plain: int = 3) -> dict:
    items = samples(data_dir, first)
    verdicts(items, workers)  # the expected outputs, computed and cached: both passes below check only
    idle, idle_seconds = verdicts(items, workers)
    load = MachineLoad(sandboxed, plain)
    try:
        loaded, loaded_seconds = verdicts(items, workers)
    finally:
        load.close()
    differ = [label for (_, _, label), a, b in zip(items, idle, loaded) if a != b]
    return {"labels": [label for _, _, label in items], "idle": idle, "loaded": loaded, "differ": differ,
            "idle_seconds": idle_seconds, "loaded_seconds": loaded_seconds, "load_executions": load.executions,
            "sandboxed": sandboxed, "plain": plain}


def figures(data_dir: str, workers: int = 2, first: int = 20) -> list[dict]:
    """A row for perf/run_all.py: the verdicts must agree; the ratio is loaded / idle wall time."""
    got = measure(data_dir, workers, first)
    ratio = got["loaded_seconds"] / got["idle_seconds"]
    agree = len(got["labels"]) - len(got["differ"])
    return [{"name": f"MBPP+ verdicts idle vs both cores saturated, {len(got['labels'])} samples",
             "value": got["loaded_seconds"], "unit": "s", "ratio": ratio, "target": "verdicts identical",
             "passed": not got["differ"],
             "note": f"{agree}/{len(got['labels'])} agree; idle {got['idle_seconds']:.1f} s, loaded "
                     f"{got['loaded_seconds']:.1f} s beside {got['sandboxed']} sandboxed loops "
                     f"({got['load_executions']} executions) and {got['plain']} CPU-bound processes"}]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=str(HERE.parents[1] / "shared" / "data"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--first", type=int, default=20, help="also the first N problems' canonical solutions")
    ap.add_argument("--sandboxed", type=int, default=3, help="sandboxed executions computing beside the loaded pass")
    ap.add_argument("--plain", type=int, default=3, help="plain CPU-bound processes beside the loaded pass")
    args = ap.parse_args()
    print(f"machine: fixed loop {fixed_loop_seconds():.3f} s, load average {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} cores")
    got = measure(args.data_dir, args.workers, args.first, args.sandboxed, args.plain)
    width = max(len(label) for label in got["labels"])
    show = lambda v: ("pass" if v[1] else "base only" if v[0] else "fail") + \
        (f" ({v[2]} test {v[3]}: {v[4]})" if v[2] else "")  # noqa: E731
    for label, a, b in zip(got["labels"], got["idle"], got["loaded"]):
        print(f"  {label:<{width}}  idle: {show(a):<32} loaded: {show(b):<32} {'same' if a == b else 'DIFFERENT'}")
    n = len(got["labels"])
    print(f"verdicts: {n - len(got['differ'])}/{n} agree" + (f"; differ on {', '.join(got['differ'])}" if got["differ"]
                                                               else ""))
    print(f"idle pass:   {got['idle_seconds']:7.1f} s")
    print(f"loaded pass: {got['loaded_seconds']:7.1f} s beside {got['sandboxed']} sandboxed loops "
          f"({got['load_executions']} executions of 2 s of CPU) and {got['plain']} CPU-bound processes")
    print(f"ratio loaded / idle = {got['loaded_seconds'] / got['idle_seconds']:.2f}x wall; "
          f"{verdict(not got['differ'])} (target: identical verdicts)")
    print(f"machine after: fixed loop {fixed_loop_seconds():.3f} s, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
