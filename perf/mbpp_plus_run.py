"""MBPP+ full canonical run: wall time of heldout's sandboxed evaluator, against evalplus's own.

Both evaluate the same samples (every problem's prompt + canonical solution) from the same file,
cold (expected outputs computed in the run, as on a first evaluation), with the same number of
workers, in the same run. heldout: ``check_many`` (sandboxed executions forked by the fork server,
at most ``--workers`` at a time, in one schedule: expected outputs first, 20 canonical solutions
per run and the rest of a slow problem's inputs dealt over the workers, and each problem's check
as soon as its outputs are complete, largest reference time first; the sandbox probe and the
fork server's start are included). evalplus
(optional, ``pip install heldout[evalplus]``): ``evalplus.evaluate.evaluate`` with
``MBPP_OVERRIDE_PATH`` pointing at the local file and its ground-truth cache cleared first.
Printed: seconds of each, pass counts (base, plus), the problems whose verdicts differ (with
evalplus's own status for them), and the ratio heldout / evalplus (issue 19's goal: <= 0.5x on
all 378 problems, faster than evalplus on a subset). Every sample is a canonical solution, so
every verdict should be a pass; evalplus fails its own on Mbpp/255 (even run alone) and on a slow
problem or two under load, and those are the only differences a passing row allows.

    python perf/mbpp_plus_run.py [--data-dir ../shared/data] [--workers 2] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from heldout.contracts import RunLimits
from heldout.benchmarks.mbpp_plus.execution import check_many, load_problems

ROOT = Path(__file__).resolve().parents[1]

# evalplus runs in its own interpreter so that its imports (transformers, provider SDKs) and its
# ground-truth cache stay out of this process
EVALPLUS_RUNNER = r"""
import json, os, sys, time
from evalplus.evaluate import evaluate
samples, workers = sys.argv[1], int(sys.argv[2])
start = time.perf_counter()
evaluate("mbpp", samples=samples, parallel=workers, i_just_wanna_run=True)
seconds = time.perf_counter() - start
res = json.load(open(samples.replace(".jsonl", "_eval_results.json")))["eval"]
status = {t: [r["base_status"], r["plus_status"]] for t, v in res.items() for r in v[:1]}
base = sum(b == "pass" for b, _ in status.values())
plus = sum(b == "pass" and p == "pass" for b, p in status.values())
print(json.dumps({"seconds": seconds, "base": base, "plus": plus, "n": len(res), "status": status}))
"""


def differences(problems: list[dict], results: list, theirs: dict) -> tuple[list[str], bool]:
    """The problems whose base or plus verdict differs, each with evalplus's own statuses, and
    whether heldout's verdicts are right anyway: every sample is a canonical solution, so the
    right verdict is a pass, and a difference is acceptable only where heldout passes and evalplus
    fails its own canonical solution (it does on Mbpp/255 even run alone, and on a slow problem
    or two under load)."""
    out, right = [], True
    for p, r in zip(problems, results):
        b, s = theirs["status"].get(p["task_id"], ["missing", "missing"])
        right = right and r.base_pass and r.plus_pass
        if (r.base_pass, r.plus_pass) != (b == "pass", b == "pass" and s == "pass"):
            out.append(f"{p['task_id']} (heldout base/plus {r.base_pass}/{r.plus_pass}; evalplus {b}/{s})")
    return out, right


def run_evalplus(jsonl: Path, problems: list[dict], workers: int) -> dict | None:
    try:
        import evalplus  # noqa: F401
    except ImportError:
        return None
    from evalplus.data.utils import CACHE_DIR

    work = Path(tempfile.mkdtemp(prefix="heldout-perf-evalplus-"))
    try:
        data = work / "mbpp_plus.jsonl"
        data.write_text("".join(json.dumps(p) + "\n" for p in problems))
        samples = work / "samples.jsonl"
        samples.write_text("".join(json.dumps({"task_id": p["task_id"], "solution": p["prompt"] + p["canonical_solution"]})
                                   + "\n" for p in problems))
        for cached in Path(CACHE_DIR).glob("*.pkl") if Path(CACHE_DIR).is_dir() else []:
            cached.unlink()  # cold ground truth, like heldout's run
        env = {**os.environ, "MBPP_OVERRIDE_PATH": str(data)}
        out = subprocess.run([sys.executable, "-c", EVALPLUS_RUNNER, str(samples), str(workers)], env=env,
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def figures(data_dir: str, workers: int = 2, limit: int | None = 30) -> list[dict]:
    """Rows for perf/run_all.py: heldout / evalplus wall time on the first ``limit`` problems
    (None: all 378; target <= 0.5x, subsets: faster), with every canonical solution passing in
    heldout and every difference from evalplus's verdicts named."""
    jsonl = Path(data_dir) / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl"
    if not jsonl.is_file():
        return [{"name": "MBPP+", "value": float("nan"), "unit": "s", "ratio": float("nan"),
                 "target": "n/a", "passed": False, "note": f"no data at {jsonl}"}]
    problems = load_problems(jsonl)[:limit]
    start = time.perf_counter()
    results = check_many([(p, p["prompt"] + p["canonical_solution"]) for p in problems], workers=workers,
                         limits=RunLimits(wall_seconds=120, cpu_seconds=120, memory_mb=4096))
    mine = time.perf_counter() - start
    base, plus = sum(r.base_pass for r in results), sum(r.plus_pass for r in results)
    theirs = run_evalplus(jsonl, problems, workers)
    target = 0.5 if limit is None else 1.0
    name = f"MBPP+ canonical run, {len(problems)} problems, {workers} workers (heldout / evalplus)"
    if theirs is None:
        return [{"name": name, "value": mine, "unit": "s", "ratio": float("nan"), "target": f"<= {target:g}x",
                 "passed": False, "note": "evalplus not installed (pip install heldout[evalplus])"}]
    differ, right = differences(problems, results, theirs)
    ratio = mine / theirs["seconds"]
    verdicts = "identical" if not differ else "differ on " + ", ".join(differ)
    return [{"name": name, "value": mine, "unit": "s", "ratio": ratio,
             "target": f"<= {target:g}x evalplus", "passed": ratio <= target and right,
             "note": f"evalplus {theirs['seconds']:.1f} s; verdicts {verdicts} (heldout base {base}, plus {plus}"
                     f"{'' if right else ': NOT every canonical solution passes'})"}]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="only the first N problems")
    args = ap.parse_args()
    jsonl = Path(args.data_dir) / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl"
    problems = load_problems(jsonl)[: args.limit]

    start = time.perf_counter()
    results = check_many([(p, p["prompt"] + p["canonical_solution"]) for p in problems], workers=args.workers,
                         limits=RunLimits(wall_seconds=120, cpu_seconds=120, memory_mb=4096))
    mine = time.perf_counter() - start
    base = sum(r.base_pass for r in results)
    plus = sum(r.plus_pass for r in results)
    print(f"problems: {len(problems)}, workers: {args.workers}")
    print(f"heldout  (sandboxed): {mine:8.1f} s   base {base}/{len(problems)}  plus {plus}/{len(problems)}")
    theirs = run_evalplus(jsonl, problems, args.workers)
    if theirs is None:
        print("evalplus not installed: no reference (pip install heldout[evalplus])")
        return
    print(f"evalplus (its own):   {theirs['seconds']:8.1f} s   base {theirs['base']}/{theirs['n']}  "
          f"plus {theirs['plus']}/{theirs['n']}")
    differ, right = differences(problems, results, theirs)
    print("verdicts: " + ("identical" if not differ else "differ on " + ", ".join(differ))
          + ("" if right else " (NOT every canonical solution passes in heldout)"))
    goal = "<= 0.5x" if args.limit is None else "faster than evalplus"
    print(f"ratio heldout / evalplus = {mine / theirs['seconds']:.2f}x (goal {goal})")


if __name__ == "__main__":
    main()
