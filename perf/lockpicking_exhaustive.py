"""Exhaustive recovery check of lockpicking/six (issue 5's performance target).

Checks the champion SQL body against the true rule system on all 10^6 six-digit strings plus the
malformed set. The target is "about a second" in DuckDB; the reference, measured in the same run,
is a plain Python loop that evaluates the same expression (the champion's per-position conditions,
written as Python) on the same strings and compares with the same truth array. Printed: seconds
of each (best of --repeat), the ratio python / duckdb, and both agreements (both must be 1.0).
A second reference is the generic rule-engine loop (``TRUTH.label`` per string, run once).
perf/run_all.py's row is the check over its own work in the same executions (target <= 1.15x),
beside the child's own function run bare in this process on the same table (see ``figures``).

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
from heldout.contracts import RunLimits

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


def exhaustive_outputs(shared: bool = True) -> np.ma.MaskedArray:
    """heldout's exhaustive check of the champion, as the task runs it."""
    checked = sqlmod.check_sql(CHAMPION["scorer.sql"])
    return sqlmod.exhaustive_outputs(checked, MALFORMED, limits=RunLimits(cpu_seconds=120, memory_mb=1024), shared=shared)


def agreement(got: np.ma.MaskedArray, truth: np.ndarray) -> float:
    return float(((~np.ma.getmaskarray(got)) & (np.ma.getdata(got) == truth)).mean())


def duckdb_check(truth: np.ndarray, shared: bool = True) -> float:
    return agreement(exhaustive_outputs(shared), truth)


def duckdb_plain_check(truth: np.ndarray) -> float:
    return duckdb_check(truth, shared=False)


def bare_outputs() -> Callable[[], dict]:
    """The check's work bare: the child's own function (``sql_child.run_outputs``: DuckDB on the
    six-digit table, rows placed by value, encoded) called in this process, no sandbox and no
    transport, on a copy of the same table file and with the same threads."""
    home = Path(tempfile.mkdtemp(prefix="heldout-perf-lockpicking-"))
    shutil.copy(sql_child.__file__, home / "lockpicking_child_bare.py")
    shutil.copy(sqlmod._six_digit_db_file(), home / sql_child.SIX_DIGIT_DB)
    spec = importlib.util.spec_from_file_location("lockpicking_child_bare", home / "lockpicking_child_bare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    atexit.register(shutil.rmtree, home, True)
    query = sqlmod._exhaustive_query(sqlmod.check_sql(CHAMPION["scorer.sql"]), shared=True)
    return lambda: module.run_outputs(query, list(MALFORMED), 1024, sqlmod.EXHAUSTIVE_THREADS)


def figures(repeat: int = 5) -> list[dict]:
    """Rows for perf/run_all.py: heldout's exhaustive check over the check's own work, both from
    the same executions: the wall time of the whole check (sandbox start, the query and its
    answer through the sandbox, decoding) over the child's own time for the same execution
    (``run_outputs``' ``seconds``), summed over ``repeat``. This machine's speed moves by 2x
    between neighbouring runs (the same query took 0.24-0.56 s back to back), which a ratio of
    two separate runs cannot resolve against a harness share of ~30 ms. Beside it: the same
    function bare in this process (interleaved, best of ``repeat``), which shows whether the
    sandbox slows the work itself (a fresh process touches DuckDB's memory anew, which this warm
    process does not: no isolated execution reaches that figure); issue 19's fixed 0.35 s; the
    plain translation."""
    truth = _exhaustive_truth()
    bare = bare_outputs()
    inside: list[float] = []
    real_in_sandbox = sqlmod._in_sandbox

    def recording(*args, **kwargs) -> dict:
        answer = real_in_sandbox(*args, **kwargs)
        inside.append(answer["seconds"])
        return answer

    exhaustive_outputs()  # warm: the fork server's start and the first sandbox are not a check's cost
    wall, ceiling, accs = [], [], []
    for _ in range(repeat):
        start = time.perf_counter()
        bare()
        ceiling.append(time.perf_counter() - start)
        sqlmod._in_sandbox = recording
        try:
            start = time.perf_counter()
            got = exhaustive_outputs()
            wall.append(time.perf_counter() - start)
        finally:
            sqlmod._in_sandbox = real_in_sandbox
        accs.append(agreement(got, truth))
    plain_s, plain_acc = best_of(duckdb_plain_check, truth, 3)
    if set(accs) != {1.0} or plain_acc != 1.0 or len(inside) != repeat:
        raise SystemExit("the champion must agree with the truth everywhere, each check in one execution")
    ratio = sum(wall) / sum(inside)
    share_ms = (sum(wall) - sum(inside)) / repeat * 1000
    ours, floor = min(wall), min(ceiling)
    return [{"name": "lockpicking exhaustive check over its own work, 10^6 strings", "value": ours, "unit": "s",
             "ratio": ratio, "target": f"<= {CEILING_TARGET}x (the check's own time, same executions)",
             "passed": ratio <= CEILING_TARGET,
             "note": f"harness share {share_ms:.0f} ms a check over {repeat} after a warm-up (sandbox start, "
                     f"the answer's transport, decoding); the check's own time in the sandbox, best {min(inside):.3f} s, and "
                     f"bare in this process {floor:.3f} s (same table, {sqlmod.EXHAUSTIVE_THREADS} DuckDB threads, "
                     f"interleaved): {min(inside) / floor:.2f}x; best check {ours:.3f} s = {ours / floor:.2f}x bare; "
                     f"issue 19's fixed 0.35 s: {'met' if ours <= 0.35 else 'missed'} (bare alone: "
                     f"{'met' if floor <= 0.35 else 'missed'}); plain translation {plain_s:.3f} s "
                     f"({plain_s / ours:.1f}x slower)"}]


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
    print(f"  its work bare:        {bare_s:.3f} s  (the child's function in this process; ratio {duck_s / bare_s:.2f}x)")
    print(f"  plain translation:    {plain_s:.3f} s  agreement {plain_acc:.6f}  (each substring per occurrence)")
    print(f"plain Python loop:      {py_s:.3f} s  agreement {py_acc:.6f}")
    print(f"ratio python / duckdb:  {py_s / duck_s:.2f}x")
    print(f"rule-engine loop:       {eng_s:.3f} s  agreement {eng_acc:.6f}  (TRUTH.label per string, once; "
          f"ratio {eng_s / duck_s:.2f}x)")
    assert duck_acc == py_acc == eng_acc == 1.0, "the champion must agree with the truth everywhere"


if __name__ == "__main__":
    main()
