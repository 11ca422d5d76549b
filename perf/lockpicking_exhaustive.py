"""Exhaustive recovery check of lockpicking/six (issue 5's performance target).

Checks the champion SQL body against the true rule system on all 10^6 six-digit strings plus the
malformed set. The target is "about a second" in DuckDB; the reference, measured in the same run,
is a plain Python loop that evaluates the same expression (the champion's per-position conditions,
written as Python) on the same strings and compares with the same truth array. Printed: seconds
of each (best of --repeat), the ratio python / duckdb, and both agreements (both must be 1.0).
A second reference is the generic rule-engine loop (``TRUTH.label`` per string, run once).
perf/run_all.py's row is the check over its ceiling: the child's own function run bare in this
process (no sandbox, no transport) on the same table, interleaved with the check (target <= 1.15x).

    python perf/lockpicking_exhaustive.py [--repeat 3]
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable
import argparse
import atexit
import importlib.util
import re
import shutil
import tempfile
import time

import numpy as np

from heldout.benchmarks.lockpicking import sql as sqlmod, sql_child
from heldout.benchmarks.lockpicking.rules import MALFORMED, TRUTH
from heldout.benchmarks.lockpicking.task import BENCHMARK, _exhaustive_truth

# the CoCoEvolve champion (the full rule set as SQL): a test fixture, never shipped in the package
CHAMPION = {"scorer.sql": (Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "lockpicking_champion.sql").read_text(encoding="utf-8")}


_SIX_DIGITS = re.compile(r"[0-9]{6}")
CEILING_TARGET = 1.15  # harness overhead <= 15% of the check's own work, as for VLIW candidates


def champion_python(program: str) -> int:
    """The champion expression, written as a plain Python function."""
    if not _SIX_DIGITS.fullmatch(program):
        return 0
    p1, p2, p3, p4, p5, p6 = program
    return ((p1 in "147" and p2 != "8" and p3 != "3" and p5 != "5" and p6 != "2")
            + (p2 in "268" and p1 != "4" and p3 != "3" and p4 != "7" and p5 != "8")
            + (p3 in "039" and p1 != "1" and p2 != "8" and p4 != "7" and p6 != "2")
            + (p4 in "147" and p2 != "6" and p3 != "0" and p5 != "5" and p6 != "9")
            + (p5 in "058" and p1 != "1" and p2 != "6" and p4 != "1" and p6 != "9")
            + (p6 in "259" and p1 != "4" and p3 != "0" and p4 != "1" and p5 != "8"))


def duckdb_check(truth: np.ndarray, shared: bool = True) -> float:
    checked = sqlmod.check_sql(CHAMPION["scorer.sql"])
    got = sqlmod.exhaustive_outputs(checked, MALFORMED, wall_seconds=120, memory_mb=1024, shared=shared)
    return float(((~np.ma.getmaskarray(got)) & (np.ma.getdata(got) == truth)).mean())


def duckdb_plain_check(truth: np.ndarray) -> float:
    return duckdb_check(truth, shared=False)


def bare_outputs() -> Callable[[], dict]:
    """The ceiling: the child's own function (``sql_child.run_outputs``: DuckDB on the six-digit
    table, rows placed by value, encoded) called in this process, no sandbox and no transport,
    on a copy of the same table file and with the same threads."""
    home = Path(tempfile.mkdtemp(prefix="heldout-perf-lockpicking-"))
    shutil.copy(sql_child.__file__, home / "lockpicking_child_bare.py")
    shutil.copy(sqlmod._six_digit_db_file(), home / sql_child.SIX_DIGIT_DB)
    spec = importlib.util.spec_from_file_location("lockpicking_child_bare", home / "lockpicking_child_bare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    atexit.register(shutil.rmtree, home, True)
    query = sqlmod._exhaustive_query(sqlmod.check_sql(CHAMPION["scorer.sql"]), shared=True)
    return lambda: module.run_outputs(query, list(MALFORMED), 1024, sqlmod.EXHAUSTIVE_THREADS)


def figures(repeat: int = 3) -> list[dict]:
    """Rows for perf/run_all.py: the exhaustive check's wall seconds (best of ``repeat``) over its
    ceiling (the same function run bare in this process, best of ``repeat``, interleaved), with
    issue 19's fixed 0.35 s, the CPU seconds and the plain translation alongside."""
    truth = _exhaustive_truth()
    bare = bare_outputs()
    wall, cpu, ceiling = [], [], []
    for _ in range(repeat):
        start = time.perf_counter()
        bare()
        ceiling.append(time.perf_counter() - start)
        w, c = time.perf_counter(), time.process_time()
        acc = duckdb_check(truth)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    plain_s, plain_acc = best_of(duckdb_plain_check, truth, repeat)
    if acc != 1.0 or plain_acc != 1.0:
        raise SystemExit("the champion must agree with the truth everywhere")
    ours, floor = min(wall), min(ceiling)
    return [{"name": "lockpicking exhaustive check over its ceiling, 10^6 strings", "value": ours, "unit": "s",
             "ratio": ours / floor, "target": f"<= {CEILING_TARGET}x (the same check bare)",
             "passed": ours / floor <= CEILING_TARGET,
             "note": f"ceiling {floor:.3f} s = the child's function in this process, no sandbox, same table and "
                     f"{sqlmod.EXHAUSTIVE_THREADS} DuckDB threads; issue 19's fixed 0.35 s: "
                     f"{'met' if ours <= 0.35 else 'missed'} (the ceiling alone: "
                     f"{'met' if floor <= 0.35 else 'missed'}); parent cpu {min(cpu):.3f} s; plain translation "
                     f"{plain_s:.3f} s ({plain_s / ours:.1f}x slower)"}]


def python_check(truth: np.ndarray) -> float:
    strings = [f"{k:06d}" for k in range(10**6)] + list(MALFORMED)
    got = np.fromiter((champion_python(s) for s in strings), dtype=np.int64, count=len(strings))
    return float((got == truth).mean())


def rule_engine_check(truth: np.ndarray) -> float:
    strings = [f"{k:06d}" for k in range(10**6)] + list(MALFORMED)
    got = np.fromiter((TRUTH.label(s) for s in strings), dtype=np.int64, count=len(strings))
    return float((got == truth).mean())


def best_of(fn, truth: np.ndarray, repeat: int) -> tuple[float, float]:
    times, value = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn(truth)
        times.append(time.perf_counter() - start)
    return min(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    start = time.perf_counter()
    truth = _exhaustive_truth()
    truth_s = time.perf_counter() - start
    duck_s, duck_acc = best_of(duckdb_check, truth, args.repeat)
    py_s, py_acc = best_of(python_check, truth, args.repeat)
    eng_s, eng_acc = best_of(rule_engine_check, truth, 1)
    n = truth.size
    print(f"strings checked:        {n} (10^6 six-digit + {len(MALFORMED)} malformed)")
    print(f"truth labels (numpy):   {truth_s:.3f} s (once, cached)")
    plain_s, plain_acc = best_of(duckdb_plain_check, truth, args.repeat)
    bare = bare_outputs()
    bare_s, _ = best_of(lambda _truth: bare(), truth, args.repeat)
    print(f"DuckDB exhaustive:      {duck_s:.3f} s  agreement {duck_acc:.6f}  (target: 0.35 s, issue 19)")
    print(f"  its ceiling (bare):   {bare_s:.3f} s  (the child's function in this process; ratio {duck_s / bare_s:.2f}x)")
    print(f"  plain translation:    {plain_s:.3f} s  agreement {plain_acc:.6f}  (each substring per occurrence)")
    print(f"plain Python loop:      {py_s:.3f} s  agreement {py_acc:.6f}")
    print(f"ratio python / duckdb:  {py_s / duck_s:.2f}x")
    print(f"rule-engine loop:       {eng_s:.3f} s  agreement {eng_acc:.6f}  (TRUTH.label per string, once; "
          f"ratio {eng_s / duck_s:.2f}x)")
    assert duck_acc == py_acc == eng_acc == 1.0, "the champion must agree with the truth everywhere"


if __name__ == "__main__":
    main()
