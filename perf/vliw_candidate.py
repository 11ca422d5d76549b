"""Per-candidate cost of ``vliw/takehome`` (issue 19): build in the sandbox + decode + 8 instances,
each candidate distinct (a fresh comment line), so the build cache never helps.

Measured in the same run for both kernels (the baseline seed and the dense packed kernel):
the compact build form (the default) and the plain JSON form it replaced, plus the reference
machine on one baseline instance. The original take-home harness is not ours to ship, so its
figures are the issue's: ~4.3 s per baseline candidate idle (0.5 s per instance run) and
~0.8 s per dense candidate; the targets are >= 10x and >= 5x those, and the reference machine
within 2x of the original's 0.5 s per baseline run.

    python perf/vliw_candidate.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from heldout.benchmarks.vliw import simulate
from heldout.benchmarks.vliw.benchmark import make_instance
from heldout.benchmarks.vliw.task import PACKAGE_DIR, VliwTakehome
from heldout.contracts import Example

ORIGINAL_SECONDS = {"baseline": 4.3, "packed": 0.8}  # the figures (idle machine)
TARGET_RATIO = {"baseline": 10.0, "packed": 5.0}
ORIGINAL_REFERENCE_RUN = 0.5  # the original simulator, one baseline instance
SHAPE = {"forest_height": 10, "batch_size": 256, "rounds": 16}
_counter = iter(range(10**9))


def per_candidate(bench: VliwTakehome, source: str, repeat: int) -> float:
    """Best of ``repeat``: a distinct candidate built once and run on the 8 hidden test slots (each
    a fresh instance drawn at scoring time, as in a real held-out scoring)."""
    examples = [Example(id=f"test-{k}", input={"fresh": True, "slot": k, **SHAPE}, target=None) for k in range(8)]
    best = float("inf")
    for _ in range(repeat):
        candidate = {"perf_takehome.py": f"{source}\n# distinct candidate {next(_counter)}\n"}
        start = time.perf_counter()
        verdicts = [bench.run(candidate, ex) for ex in examples]
        best = min(best, time.perf_counter() - start)
        if not all(v.valid for v in verdicts):
            raise SystemExit(f"kernel failed: {verdicts[0].error}")
    return best


def figures(repeat: int = 3) -> list[dict]:
    """Rows for perf/run_all.py: name, value, unit, ratio, target, passed, note."""
    compact, plain = VliwTakehome(build_form="compact"), VliwTakehome(build_form="json")
    simulate([{"alu": [("+", 0, 0, 0)]}], [0])  # numba load outside the timings
    rows = []
    for name in ("baseline", "packed"):
        source = (PACKAGE_DIR / "kernels" / f"{name}.py").read_text(encoding="utf-8")
        per_candidate(compact, source, 1)  # warm (page cache, first sandbox)
        fast_s = per_candidate(compact, source, repeat)
        json_s = per_candidate(plain, source, repeat)
        ratio = ORIGINAL_SECONDS[name] / fast_s
        rows.append({"name": f"vliw per-candidate, {name} (build + decode + 8 instances)",
                     "value": fast_s, "unit": "s", "ratio": ratio, "target": f">= {TARGET_RATIO[name]:g}x original",
                     "passed": ratio >= TARGET_RATIO[name],
                     "note": f"original {ORIGINAL_SECONDS[name]} s (issue's figure); JSON path now {json_s:.3f} s "
                             f"({json_s / fast_s:.1f}x slower)"})
    program = compact.build({"perf_takehome.py": (PACKAGE_DIR / "kernels" / "baseline.py").read_text()}, SHAPE)
    mem, _ = make_instance(2024)
    ref_program = _baseline_stream()
    start = time.perf_counter()
    ref = simulate(ref_program, mem, engine="reference")
    ref_s = time.perf_counter() - start
    fast = simulate(program.program, mem)
    if (ref.cycles, ref.memory, ref.scratch) != (fast.cycles, fast.memory, fast.scratch):
        raise SystemExit("reference and fast machines differ on the baseline")
    rows.append({"name": "vliw reference machine, one baseline instance", "value": ref_s, "unit": "s",
                 "ratio": ref_s / ORIGINAL_REFERENCE_RUN, "target": "<= 2x original (0.5 s)",
                 "passed": ref_s <= 2 * ORIGINAL_REFERENCE_RUN, "note": f"{ref.cycles} cycles"})
    return rows


def _baseline_stream() -> list:
    """The baseline's stream as plain bundles (built in the sandbox, JSON form)."""
    import json

    from heldout.sandbox import run_function

    source = (PACKAGE_DIR / "kernels" / "baseline.py").read_text(encoding="utf-8")
    res = run_function({"perf_takehome.py": source}, "_heldout_vliw_build", "build",
                       ["perf_takehome", 10, 2047, 256, 16, 10**7, "json"], limits=VliwTakehome.default_limits,
                       setup_files=VliwTakehome().helper_files())
    if not res.ok:
        raise SystemExit(f"build failed: {res.error}")
    return json.loads(res.value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for row in figures(args.repeat):
        print(f"{row['name']:<62} {row['value']:8.3f} {row['unit']}  ratio {row['ratio']:6.2f}  "
              f"target {row['target']:<22} {'PASS' if row['passed'] else 'FAIL'}  {row['note']}")


if __name__ == "__main__":
    main()
