"""Simulator throughput: the fast path (decoded arrays + numba) against the plain reference
machine, measured in the same run on the same programs and instance.

Kernels: the baseline seed (147,734 cycles, one slot per bundle) and heldout's packed vectorised
kernel (dense VALU/load bundles). Both are built in the sandbox exactly as candidates are.
Prints cycles/s (simulated charged bundles per second), slots/s and the fast/reference ratio;
also the one-off decode cost and the per-candidate cost of 8 hidden instances.

    python perf/vliw_sim.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import time

from heldout.benchmarks.vliw import decode, simulate
from heldout.benchmarks.vliw.benchmark import make_instance
from heldout.benchmarks.vliw.task import PACKAGE_DIR, TASK, VliwTakehome
from heldout.sandbox import run_function


def build(source: str, bench: VliwTakehome) -> list:
    res = run_function({"perf_takehome.py": source}, "_heldout_vliw_build", "build",
                       ["perf_takehome", 10, 2047, 256, 16, 10**7], limits=bench.default_limits,
                       setup_files=TASK.helper_files())
    if not res.ok:
        raise SystemExit(f"build failed: {res.error}")
    return json.loads(res.value)


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    bench = VliwTakehome()
    mem, _ = make_instance(2024)
    simulate([{"alu": [("+", 0, 0, 0)]}], [0])  # load/compile the numba kernel outside the timings
    print(f"{'kernel':<9} {'cycles':>7} {'slots':>8} {'ref s':>8} {'fast s':>8} {'ref slots/s':>12} "
          f"{'fast slots/s':>13} {'fast cycles/s':>14} {'ratio':>7} {'decode s':>9} {'8 inst: ref s':>14} "
          f"{'fast s':>8} {'ratio':>7}")
    for name in ("baseline", "packed"):
        program = build((PACKAGE_DIR / "kernels" / f"{name}.py").read_text(encoding="utf-8"), bench)
        t_ref, ref = best(lambda: simulate(program, mem, engine="reference"), 1 if name == "baseline" else 3)
        t_dec, decoded = best(lambda: decode(program), args.repeat)
        t_fast, fast = best(lambda: simulate(decoded, mem), args.repeat)
        same = (ref.cycles, ref.memory, ref.scratch, ref.slots) == (fast.cycles, fast.memory, fast.scratch, fast.slots)
        if not same:
            raise SystemExit(f"{name}: fast and reference results differ")
        slots = sum(fast.slots.values())
        per_candidate_fast = t_dec + 8 * t_fast
        print(f"{name:<9} {fast.cycles:>7} {slots:>8} {t_ref:>8.3f} {t_fast:>8.4f} {slots / t_ref:>12.3g} "
              f"{slots / t_fast:>13.3g} {fast.cycles / t_fast:>14.3g} {t_ref / t_fast:>6.0f}x {t_dec:>9.3f} "
              f"{8 * t_ref:>14.2f} {per_candidate_fast:>8.3f} {8 * t_ref / per_candidate_fast:>6.0f}x")
    print("ratio = reference time / fast time on the same program and instance (identical results "
          "checked); '8 inst' = one decode + 8 runs, what evaluating one candidate costs.")


if __name__ == "__main__":
    main()
