"""MBPP+ canonical run: wall time of heldout's sandboxed evaluator, against evalplus's own.

Both evaluate the same samples (every problem's prompt + canonical solution) from the same file,
cold (expected outputs computed in the run, as on a first evaluation), with the same number of
workers, each in an interpreter of its own, in the same run. heldout: ``check_many`` (sandboxed
executions forked by the fork server, at most ``--workers`` at a time, in one schedule: expected
outputs first, 20 canonical solutions per run and the rest of a slow problem's inputs dealt over
the workers, and each problem's check as soon as its outputs are complete, largest reference time
first; the sandbox probe and the fork server's start are included). evalplus (optional, ``pip
install heldout[evalplus]``): ``evalplus.evaluate.evaluate`` with ``MBPP_OVERRIDE_PATH`` pointing at
the local file and its ground-truth cache cleared first. heldout runs before and after evalplus and
its figure is the mean of the two, so that a change of the machine's speed during the run (ours
swings by up to 2x within minutes) does not favour either side.

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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# each side runs in its own interpreter: evalplus's imports (transformers, provider SDKs) and
# ground-truth cache stay out of heldout's, and both start cold
HELDOUT_RUNNER = r"""
import json, sys, time
from heldout.contracts import RunLimits
from heldout.benchmarks.mbpp_plus.execution import check_many, load_problems
path, workers, limit = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
problems = load_problems(path)[:limit]
start = time.perf_counter()
results = check_many([(p, p["prompt"] + p["canonical_solution"]) for p in problems], workers=workers,
                     limits=RunLimits(wall_seconds=120, cpu_seconds=120, memory_mb=4096))
seconds = time.perf_counter() - start
status = {r.task_id: [r.base_pass, r.plus_pass] for r in results}
print(json.dumps({"seconds": seconds, "base": sum(b for b, _ in status.values()),
                  "plus": sum(p for _, p in status.values()), "n": len(results), "status": status}))
"""
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


def _last_json_line(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_heldout(jsonl: Path, workers: int, limit: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return _last_json_line([sys.executable, "-c", HELDOUT_RUNNER, str(jsonl), str(workers), json.dumps(limit)], env)


def run_evalplus(problems: list[dict], workers: int) -> dict | None:
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
        return _last_json_line([sys.executable, "-c", EVALPLUS_RUNNER, str(samples), str(workers)], env)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def differences(mine: dict, theirs: dict) -> tuple[list[str], bool]:
    """The problems whose base or plus verdict differs, each with evalplus's own statuses, and
    whether heldout's verdicts are right anyway: every sample is a canonical solution, so the
    right verdict is a pass, and a difference is acceptable only where heldout passes and evalplus
    fails its own canonical solution."""
    out, right = [], True
    for task, (base, plus) in mine["status"].items():
        b, s = theirs["status"].get(task, ["missing", "missing"])
        right = right and base and plus
        if (base, plus) != (b == "pass", b == "pass" and s == "pass"):
            out.append(f"{task} (heldout base/plus {base}/{plus}; evalplus {b}/{s})")
    return out, right


def measure(data_dir: str, workers: int = 2, limit: int | None = 30) -> dict:
    """heldout, evalplus, heldout again, on the first ``limit`` problems (None: all 378)."""
    from heldout.benchmarks.mbpp_plus.execution import load_problems

    jsonl = Path(data_dir) / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl"
    problems = load_problems(jsonl)[:limit]
    first = run_heldout(jsonl, workers, limit)
    theirs = run_evalplus(problems, workers)
    second = run_heldout(jsonl, workers, limit) if theirs is not None else None
    runs = [first] + ([second] if second else [])
    mine = {**first, "seconds": sum(r["seconds"] for r in runs) / len(runs), "runs": [r["seconds"] for r in runs]}
    if second is not None and second["status"] != first["status"]:
        mine["status"] = {t: [a and b for a, b in zip(v, second["status"][t])] for t, v in first["status"].items()}
    got = {"problems": len(problems), "workers": workers, "heldout": mine, "evalplus": theirs}
    if theirs is not None:
        got["differ"], got["right"] = differences(mine, theirs)
        got["ratio"] = mine["seconds"] / theirs["seconds"]
    return got


def figures(data_dir: str, workers: int = 2, limit: int | None = 30) -> list[dict]:
    """Rows for perf/run_all.py: heldout / evalplus wall time on the first ``limit`` problems
    (None: all 378; target <= 0.5x, subsets: faster), with every canonical solution passing in
    heldout and every difference from evalplus's verdicts named."""
    if not (Path(data_dir) / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl").is_file():
        return [{"name": "MBPP+", "value": float("nan"), "unit": "s", "ratio": float("nan"),
                 "target": "n/a", "passed": False, "note": f"no MBPP+ data under {data_dir}"}]
    got = measure(data_dir, workers, limit)
    mine, theirs = got["heldout"], got["evalplus"]
    target = 0.5 if limit is None else 1.0
    name = f"MBPP+ canonical run, {got['problems']} problems, {workers} workers (heldout / evalplus)"
    if theirs is None:
        return [{"name": name, "value": mine["seconds"], "unit": "s", "ratio": float("nan"),
                 "target": f"<= {target:g}x", "passed": False,
                 "note": "evalplus not installed (pip install heldout[evalplus])"}]
    verdicts = "identical" if not got["differ"] else "differ on " + ", ".join(got["differ"])
    runs = " and ".join(f"{s:.1f}" for s in mine["runs"])
    return [{"name": name, "value": mine["seconds"], "unit": "s", "ratio": got["ratio"],
             "target": f"<= {target:g}x evalplus", "passed": got["ratio"] <= target and got["right"],
             "note": f"heldout {runs} s before and after evalplus's {theirs['seconds']:.1f} s; verdicts {verdicts} "
                     f"(heldout base {mine['base']}, plus {mine['plus']}"
                     f"{'' if got['right'] else ': NOT every canonical solution passes'})"}]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="only the first N problems")
    args = ap.parse_args()
    got = measure(args.data_dir, args.workers, args.limit)
    mine, theirs, n = got["heldout"], got["evalplus"], got["problems"]
    print(f"problems: {n}, workers: {args.workers}")
    print(f"heldout  (sandboxed): {mine['seconds']:8.1f} s   base {mine['base']}/{n}  plus {mine['plus']}/{n}"
          f"   (runs: {', '.join(f'{s:.1f}' for s in mine['runs'])} s)")
    if theirs is None:
        print("evalplus not installed: no reference (pip install heldout[evalplus])")
        return
    print(f"evalplus (its own):   {theirs['seconds']:8.1f} s   base {theirs['base']}/{theirs['n']}  "
          f"plus {theirs['plus']}/{theirs['n']}")
    print("verdicts: " + ("identical" if not got["differ"] else "differ on " + ", ".join(got["differ"]))
          + ("" if got["right"] else " (NOT every canonical solution passes in heldout)"))
    goal = "<= 0.5x" if args.limit is None else "faster than evalplus"
    print(f"ratio heldout / evalplus = {got['ratio']:.2f}x (goal {goal})")


if __name__ == "__main__":
    main()
