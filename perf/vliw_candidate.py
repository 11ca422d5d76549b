"""Per-candidate cost of ``vliw/takehome`` (issue 19): build in the sandbox + decode + 8 instances,
each candidate distinct (a fresh comment line), so the build cache never helps.

The original take-home harness is not ours to ship, so each kernel is also run, in the same run
and interleaved with heldout's path, through a **stand-in for it**: what the original's tests do
(import the candidate, build once, then per instance draw a tree and a batch, run the ``problem``
module's ``Machine``, run ``reference_kernel2`` and compare the values), in a fresh interpreter,
on the ``problem`` module heldout ships to builders (its ``Machine`` is heldout's reference
machine). Timed inside that process: import to last check, no interpreter start.
Side by side with the original simulator (measured ad hoc on 2026-12-02 in a calm and a slow
phase of the machine, the original not shipped), the original took 1.01-1.08x the stand-in's
time on the baseline and 1.03-1.05x on the dense kernel: a ratio against the stand-in is a ratio
against the original (slightly understated), measured under the same load.
Issue 19's targets, >= 10x on the baseline and >= 5x on the dense kernel, are reported (INFO)
beside issue 38's ceiling rows below, which replaced them. Also printed: the ratio against the
issue's fixed figures for the original (~4.3 s and ~0.8 s per candidate, an idle machine of the
day), the plain JSON form, and the reference machine on one baseline instance (target: within
2x of the original's 0.5 s).

Issue 38's rows: heldout's time per distinct candidate over its **ceiling** measured in the same
run (target <= 1.15x): the candidate's own build in a bare interpreter (timed inside it) plus the
8 instances on heldout's fastest simulator, the program decoded once. The row's note adds what that
ceiling leaves out and no sandboxed build avoids: the stream leaving the candidate's process (the
marshal form's pass there and its decoding here), beside a pickle round trip of the same stream.

    python perf/vliw_candidate.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from heldout.benchmarks.vliw import simulate
from heldout.benchmarks.vliw.machine import DecodedProgram, decode
from heldout.benchmarks.vliw.marshal_form import decode_marshal
from heldout.benchmarks.vliw.benchmark import make_instance
from heldout.benchmarks.vliw.task import MAX_BUNDLES, PACKAGE_DIR, VliwTakehome
from heldout.contracts import Example
from machine import verdict

ISSUE_ORIGINAL_SECONDS = {"baseline": 4.3, "packed": 0.8}  # the issue's figures (an idle machine of the day)
TARGET_RATIO = {"baseline": 10.0, "packed": 5.0}
ORIGINAL_REFERENCE_RUN = 0.5  # the original simulator, one baseline instance
SHAPE = {"forest_height": 10, "batch_size": 256, "rounds": 16}
N_INSTANCES = 8
_counter = iter(range(10**9))

# The original harness's shape, run in a fresh interpreter next to heldout's ``problem`` module
# and the candidate (as perf_takehome.py); prints the seconds from the candidate's import to the
# last check. Only the standard ``problem`` names: the same script runs on the original's module.
STAND_IN = """
import importlib, sys, time
from problem import Input, Machine, Tree, build_mem_image, reference_kernel2
height, batch, rounds, instances = map(int, sys.argv[1:5])
start = time.perf_counter()
builder = importlib.import_module("perf_takehome").KernelBuilder()
builder.build_kernel(height, 2 ** (height + 1) - 1, batch, rounds)
for _ in range(instances):
    forest = Tree.generate(height)
    inp = Input.generate(forest, batch, rounds)
    mem = build_mem_image(forest, inp)
    machine = Machine(mem, builder.instrs, builder.debug_info(), n_cores=1)
    machine.enable_pause = False
    machine.enable_debug = False
    machine.run()
    for ref in reference_kernel2(mem):
        pass
    lo, hi = ref[6], ref[6] + len(inp.values)
    if machine.mem[lo:hi] != ref[lo:hi]:
        raise SystemExit("wrong values")
print(time.perf_counter() - start)
"""


def one_candidate(bench: VliwTakehome, source: str) -> float:
    """Seconds for a distinct candidate built once and run on the 8 hidden test slots (each a
    fresh instance drawn at scoring time, as in a real held-out scoring)."""
    examples = [Example(id=f"test-{k}", input={"fresh": True, "slot": k, **SHAPE}, target=None)
                for k in range(N_INSTANCES)]
    candidate = {"perf_takehome.py": f"{source}\n# distinct candidate {next(_counter)}\n"}
    start = time.perf_counter()
    verdicts = [bench.run(candidate, ex) for ex in examples]
    seconds = time.perf_counter() - start
    if not all(v.valid for v in verdicts):
        raise SystemExit(f"kernel failed: {verdicts[0].error}")
    return seconds


def per_candidate(bench: VliwTakehome, source: str, repeat: int) -> float:
    """Best of ``repeat`` distinct candidates."""
    return min(one_candidate(bench, source) for _ in range(repeat))


def stand_in(folder: Path) -> float:
    """Seconds for one candidate through the stand-in for the original harness (see the module
    docstring), in a fresh interpreter in ``folder``."""
    args = [str(SHAPE["forest_height"]), str(SHAPE["batch_size"]), str(SHAPE["rounds"]), str(N_INSTANCES)]
    out = subprocess.run([sys.executable, "-c", STAND_IN, *args], cwd=folder, capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"the stand-in harness failed: {out.stderr[-500:]}")
    return float(out.stdout)


CEILING_TARGET = 1.15  # issue 38: harness overhead <= 15% of the work no harness can avoid


BARE_BUILD = """
import importlib, json, pickle, sys, time
height, batch, rounds, transfer = *map(int, sys.argv[1:4]), sys.argv[4] == "transfer"
start = time.perf_counter()
builder = importlib.import_module("perf_takehome").KernelBuilder()
builder.build_kernel(height, 2 ** (height + 1) - 1, batch, rounds)
got = {"build": time.perf_counter() - start}
if transfer:
    from _heldout_vliw_build import marshalled
    start = time.perf_counter()
    got["payload"] = marshalled(builder.instrs)
    got["send"] = time.perf_counter() - start
    start = time.perf_counter()
    pickle.loads(pickle.dumps(builder.instrs, protocol=5))
    got["pickle"] = time.perf_counter() - start
print(json.dumps(got))
"""


def _bare(folder: Path, what: str) -> dict:
    args = [str(SHAPE["forest_height"]), str(SHAPE["batch_size"]), str(SHAPE["rounds"]), what]
    out = subprocess.run([sys.executable, "-c", BARE_BUILD, *args], cwd=folder, capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"the bare build failed: {out.stderr[-500:]}")
    return json.loads(out.stdout)


def bare_build_seconds(folder: Path) -> float:
    """The candidate's own build, bare: a lean interpreter in ``folder`` (beside the ``problem``
    helper) imports it and calls ``build_kernel`` once, timed inside (no interpreter start). Not
    in this process: its large heap makes the build's allocations slower (GC), so it is no floor."""
    return _bare(folder, "build")["build"]


def transfer_seconds(folder: Path) -> dict[str, float]:
    """What getting the stream out of the candidate's process costs, the part of heldout's path
    that the ceiling leaves out: the marshal form's pass in the builder's process (marshal, zlib,
    base64), its decoding here (inflate, parse, assemble), and (the reference) a pickle round trip
    of the same stream in the builder's process."""
    got = _bare(folder, "transfer")
    start = time.perf_counter()
    if decode_marshal(got["payload"], MAX_BUNDLES) is None:
        raise SystemExit("the marshal form declined a shipped kernel")
    return {"send": got["send"], "decode": time.perf_counter() - start, "pickle": got["pickle"]}


def frozen_run_seconds(program, mems: list[list[int]]) -> float:
    """The instances alone on heldout's fastest simulator (the program decoded once, as scoring does)."""
    decoded = decode(program) if not isinstance(program, DecodedProgram) else program
    start = time.perf_counter()
    for mem in mems:
        simulate(decoded, mem)
    return time.perf_counter() - start


def figures(repeat: int = 3) -> list[dict]:
    """Rows for perf/run_all.py: name, value, unit, ratio, target, passed, note."""
    compact, plain = VliwTakehome(build_form="compact"), VliwTakehome(build_form="json")
    simulate([{"alu": [("+", 0, 0, 0)]}], [0])  # numba load outside the timings
    rows = []
    for name in ("baseline", "packed"):
        source = (PACKAGE_DIR / "kernels" / f"{name}.py").read_text(encoding="utf-8")
        one_candidate(compact, source)  # warm (page cache, first sandbox)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            for file, text in {**compact.helper_files(), "perf_takehome.py": source}.items():
                (folder / file).write_text(text, encoding="utf-8")
            program = compact.build({"perf_takehome.py": source}, SHAPE).program
            mems = [make_instance(9000 + k)[0] for k in range(N_INSTANCES)]
            fast, original, ceiling = [], [], []
            for _ in range(repeat):  # interleaved: a change of load affects all three alike
                fast.append(one_candidate(compact, source))
                original.append(stand_in(folder))
                ceiling.append(bare_build_seconds(folder) + frozen_run_seconds(program, mems))
            moved = transfer_seconds(folder)
        fast_s, original_s, ceiling_s = min(fast), min(original), min(ceiling)
        shipped = moved["send"] + moved["decode"]
        rows.append({"name": f"vliw per-candidate over its ceiling, {name}", "value": fast_s, "unit": "s",
                     "ratio": fast_s / ceiling_s, "target": f"<= {CEILING_TARGET}x (bare build + instances)",
                     "passed": fast_s / ceiling_s <= CEILING_TARGET,
                     "note": f"ceiling {ceiling_s:.3f} s = the candidate's own build in a bare interpreter + "
                             f"{N_INSTANCES} instances on the fast simulator, same run; the stream leaving the "
                             f"sandbox, which the ceiling leaves out: marshal form sent {moved['send'] * 1000:.0f} ms + "
                             f"decoding {moved['decode'] * 1000:.0f} ms (a pickle round trip of the same stream: "
                             f"{moved['pickle'] * 1000:.0f} ms); ceiling with it "
                             f"{ceiling_s + shipped:.3f} s: {fast_s / (ceiling_s + shipped):.2f}x"})
        json_s = per_candidate(plain, source, repeat)
        ratio, reachable = original_s / fast_s, original_s / ceiling_s  # reachable: with zero harness overhead
        reached = "reached" if ratio >= TARGET_RATIO[name] else "not reached"
        above = (f" (above the ceiling: zero harness overhead would give {reachable:.2f}x)"
                 if reachable < TARGET_RATIO[name] else f" (ceiling {reachable:.2f}x)")
        # issue 38 replaced issue 19's fixed speed-ups by the ceiling row above: the speed-up over
        # the original is reported beside it, the retired target named, and passes or fails nothing
        rows.append({"name": f"vliw per-candidate, {name} (build + decode + 8 instances)",
                     "value": fast_s, "unit": "s", "ratio": ratio,
                     "target": "speed-up over the original harness", "passed": None,
                     "note": f"issue 19's >= {TARGET_RATIO[name]:g}x {reached}{above}; "
                             f"original harness (stand-in, same run) {original_s:.3f} s; against the issue's "
                             f"{ISSUE_ORIGINAL_SECONDS[name]} s: {ISSUE_ORIGINAL_SECONDS[name] / fast_s:.1f}x; "
                             f"JSON path {json_s:.3f} s ({json_s / fast_s:.1f}x slower)"})
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
              f"target {row['target']:<22} {verdict(row['passed'])}  {row['note']}")


if __name__ == "__main__":
    main()
