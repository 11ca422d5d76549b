"""MBPP+ canonical run: wall time of heldout's sandboxed evaluator, against evalplus's own.

Both evaluate the same samples (every problem's prompt + canonical solution) from the same file,
cold (expected outputs computed in the run, as on a first evaluation), with the same number of
workers, each in an interpreter of its own, in the same run. heldout: ``check_many`` (sandboxed
executions forked by the fork server, at most ``--workers`` at a time, in one schedule: expected
outputs first, up to 20 canonical solutions per run (at least one run per worker) and the rest of a
slow problem's inputs dealt over the workers, and each problem's check as soon as its outputs are
complete, largest reference time first; the sandbox probe and the fork server's start are
included). evalplus (optional, ``pip install heldout[evalplus]``): ``evalplus.evaluate.evaluate``
with ``MBPP_OVERRIDE_PATH`` pointing at the local file and its ground-truth cache cleared first.
Both read the same file of the first N problems inside their timed windows (evalplus reads and
deserialises its problems inside ``evaluate``; heldout's runner used to read the whole release
file before its clock started, 0.1-0.2 s it did not count, and evalplus's 30-problem file was the
smaller one to read).
heldout runs before and after each evalplus run and a round's figure is the mean of the two, so
that a change of the machine's speed during the run (ours swings by up to 2x within minutes) does
not favour either side; with ``--rounds N`` (run_all: 5 on 30 problems) the row is the median of N
such rounds, heldout's runs shared by neighbouring rounds (a single 30-problem round ranged
0.52-1.42x in one sitting at load 10-30, evalplus alone 1.3-3.3 s).

Printed: seconds of each, pass counts (base, plus), the problems whose verdicts differ (with
evalplus's own status for them), and the ratio heldout / evalplus (issue 60's target: <= 1.0x at
every size; issue 19's 0.5x on all 378 is below the bound the programs set, see below). Every sample is a canonical solution, so
every verdict should be a pass; evalplus fails its own on Mbpp/255 (even run alone) and on a slow
problem or two under load, and those are the only differences a passing row allows.

Each row also prints heldout's floor, measured in the same run (issue 38: a row that fails says
why in numbers; on all 378 problems it adds the programs' own work once more, about a minute). Each input of an untrusted solution is sent when the parent starts its clock
and answered before the next is sent, so a check pays a round trip per input that evalplus, which
runs a problem's inputs in one unsandboxed process, does not. heldout's **floor** is what it
would take if the programs cost nothing more than they must: (1) the **zero-work floor**,
``check_many`` itself, cold, on the same problems and inputs with a canonical solution and a
candidate that return at once (every execution, round trip, comparison and the schedule, but no
program work), plus (2) the **programs' own work**: the canonical solutions on every input,
called in a bare interpreter, once for the expected outputs and once as the candidate, spread
perfectly over the workers. Beside it, the same number of round trips over bare pipes between two
processes, and the zero-work floor again with one input per problem: what the executions cost
(zygote, forks, expected-output runs, schedule) whatever their inputs, the rest of the floor being
the inputs' round trips. This floor is heldout's, not a physical ceiling: where the bare round
trips are a small part of evalplus's time and the zero-work floor is above it, the row fails on
heldout's harness, and the sentence says which part (per execution or per input). Where the
programs dominate (all 378: Mbpp/599's canonical solution alone computes for ~20 s), the
sentence gives the bound they set: both sides run every program twice (expected outputs, then
the sample), heldout both times over the workers, evalplus its ground truth serially and its
checks over the workers, so with the programs' work alone the ratio is 2 / (workers + 1):
0.67x on 2 workers, above issue 19's 0.5x unless evalplus spends more than its programs.

Each side also prints the **machine CPU** of its timed window (every process it started: pool
workers, fork server, sandboxes; read from a cgroup-v1 cpuacct group made for each runner, where
the harness is root), which the machine's load does not change as it changes wall time. On 30
problems the two were about equal with check_many's runs in-process: heldout 0.94-1.17 CPU-s,
evalplus 0.85-1.33 (load 2-11, issue 60; on all 378, 114.6 against 181.8), so the wall gap was how
that CPU is spread over the cores: evalplus runs its programs in pool processes without round
trips, heldout's worker is a chain (monitor thread, then the child, then the thread again, each
waking the other: a wake-up across cores costs 50-120 us of wall in this VM against 9 us on one,
bare pipes measured) after a serial start (the fork server, ~0.1 s, before any execution). With a
worker process per worker, each on a core of its own, the chain stays on one core, at a cost in
CPU: each worker process starts its own fork server and probes bwrap (1.24-1.43 CPU-s on 30
problems at load 7-11, evalplus 1.09-1.33; on all 378, 116.5 against 213.9 at load 6-8). Where heldout's CPU goes, measured the same way: an execution ~10-11.5 ms (the
harness 2-3 ms, the fork server's spare ~2.5 ms, the child ~6 ms of which ~1.5 ms copy-on-write
page copies), an input 63-72 us (harness 30-33 us, of it ~10 us of Python; child 33-39 us, ~17 us
of Python; two context switches), the fork server's start ~0.1 s. Each of these alone measured
no better: each worker's monitor in a process of its own (two one-worker harnesses against one
two-worker harness, at load 3-5: as slow or slower), each worker's thread and child pinned to one
core (within noise: median 1.57 against 1.68 s at load 8); both together are what check_many
does now (a worker process per worker, on a core of its own: see
``heldout/benchmarks/mbpp_plus/_schedule.py``; the whole run confined to one core had been
faster than on two, 1.0-1.35 against 1.1-1.9 s at load 8). Also no better: the helper's files
hard-linked into each code dir instead of written; a shorter scheduler slice for the harness and
its runs (``sched_setattr``: as fast or slower with four spinners beside it); starting the fork
server at check_many's start instead of its first run (the planning before that run is 5-8 ms
of the zygote's 0.1-0.16 s start: no difference over 6 interleaved rounds). A full garbage
collection inside a check (~20 ms of CPU with the interpreter lock held, 67-167 ms of wall at
load 6) no longer happens (``older_objects_frozen``).

    python perf/mbpp_plus_run.py [--data-dir ../shared/data] [--workers 2] [--limit N] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# each side runs in its own interpreter: evalplus's imports (transformers, provider SDKs) and
# ground-truth cache stay out of heldout's, and both start cold. Where the runner was started in a
# cpuacct group of its own (see _own_cpu_group), it also reports the machine CPU its whole process
# tree used in the timed window (pool workers, fork server, sandboxes), which a machine's load
# does not change as it changes wall time
MACHINE_CPU = r"""
def machine_cpu():
    try:
        for line in open("/proc/self/cgroup"):
            _, names, path = line.strip().split(":", 2)
            if "cpuacct" in names.split(",") and "heldout-perf-" in path:
                return int(open(f"/sys/fs/cgroup/cpuacct{path}/cpuacct.usage").read()) / 1e9
    except (OSError, ValueError):
        pass
    return None
"""
HELDOUT_RUNNER = MACHINE_CPU + r"""
import json, sys, time
from heldout.contracts import RunLimits
from heldout.benchmarks.mbpp_plus.execution import check_many, load_problems
path, workers = sys.argv[1], int(sys.argv[2])
start, cpu = time.perf_counter(), machine_cpu()
problems = load_problems(path)  # in the window, as evalplus reads its problems in its own
results = check_many([(p, p["prompt"] + p["canonical_solution"]) for p in problems], workers=workers,
                     limits=RunLimits(wall_seconds=120, cpu_seconds=120, memory_mb=4096))
seconds, cpu = time.perf_counter() - start, None if cpu is None else machine_cpu() - cpu
status = {r.task_id: [r.base_pass, r.plus_pass] for r in results}
print(json.dumps({"seconds": seconds, "cpu": cpu, "base": sum(b for b, _ in status.values()),
                  "plus": sum(p for _, p in status.values()), "n": len(results), "status": status}))
"""
# the zero-work floor: the same problems and inputs, every program returning at once (an empty
# tuple: equal to itself, and a set for the set-compared tasks), cold, through check_many itself
FLOOR_RUNNER = r"""
import json, sys, time
from heldout.contracts import RunLimits
from heldout.benchmarks.mbpp_plus.execution import check_many, load_problems
path, workers = sys.argv[1], int(sys.argv[2])
one_input = sys.argv[3:4] == ["one"]  # each problem's first base input alone: the per-execution part
items = []
for p in load_problems(path):
    nothing = f"def {p['entry_point']}(*args, **kwargs):\n    return ()\n"
    cut = {"base_input": p["base_input"][:1], "plus_input": []} if one_input else {}
    items.append(({**p, **cut, "prompt": "", "canonical_solution": nothing}, nothing))
start = time.perf_counter()
results = check_many(items, workers=workers, limits=RunLimits(wall_seconds=120, cpu_seconds=120, memory_mb=4096))
seconds = time.perf_counter() - start
ran = sum(r.base.passed + (r.plus.passed if r.plus else 0) for r in results)
print(json.dumps({"seconds": seconds, "inputs_run": ran}))
"""
# the programs' own work: each canonical solution called on every input in a bare interpreter
# (a fresh copy of the input per call, deserialised as the sandbox's helper passes it; neither
# is timed)
OWN_WORK_RUNNER = r"""
import copy, json, sys, time
from heldout.benchmarks.mbpp_plus._child import deserialize
from heldout.benchmarks.mbpp_plus.execution import load_problems
path = sys.argv[1]
seconds = 0.0
for p in load_problems(path):
    space = {"__name__": "canonical"}
    exec(compile(p["prompt"] + p["canonical_solution"], p["task_id"], "exec"), space)
    fn = space[p["entry_point"]]
    for inp in list(p["base_input"]) + list(p["plus_input"]):
        args = deserialize(p["task_id"], copy.deepcopy(inp))  # as the task's helper passes them
        start = time.perf_counter()
        fn(*args)
        seconds += time.perf_counter() - start
print(json.dumps({"seconds": seconds}))
"""
EVALPLUS_RUNNER = MACHINE_CPU + r"""
import json, os, sys, time
from evalplus.evaluate import evaluate
samples, workers = sys.argv[1], int(sys.argv[2])
start, cpu = time.perf_counter(), machine_cpu()
evaluate("mbpp", samples=samples, parallel=workers, i_just_wanna_run=True)
seconds, cpu = time.perf_counter() - start, None if cpu is None else machine_cpu() - cpu
res = json.load(open(samples.replace(".jsonl", "_eval_results.json")))["eval"]
status = {t: [r["base_status"], r["plus_status"]] for t, v in res.items() for r in v[:1]}
base = sum(b == "pass" for b, _ in status.values())
plus = sum(b == "pass" and p == "pass" for b, p in status.values())
print(json.dumps({"seconds": seconds, "cpu": cpu, "base": base, "plus": plus, "n": len(res), "status": status}))
sys.stdout.flush()
os._exit(0)  # evalplus's stuck-sample watcher (a thread that sleeps 20 s) would hold the process after its run
"""


def _last_json_line(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    group = _own_cpu_group()
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True,
                             preexec_fn=None if group is None else lambda: (group / "cgroup.procs").write_text("0"))
    finally:
        if group is not None:
            try:
                group.rmdir()
            except OSError:
                pass  # a process of the run still in it: the system's cleanup takes the empty group
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _own_cpu_group() -> Path | None:
    """A fresh cgroup-v1 cpuacct group beside this process's own, for one runner and everything it
    starts (None where none can be made: not root, no v1 cpuacct hierarchy). Its counter is
    what the runner reads as machine CPU; the sandbox's own groups nest inside it."""
    try:
        own = next(line.strip().split(":", 2)[2] for line in open("/proc/self/cgroup")
                   if "cpuacct" in line.split(":", 2)[1].split(","))
        group = Path("/sys/fs/cgroup/cpuacct") / own.lstrip("/") / f"heldout-perf-{os.getpid()}-{time.monotonic_ns()}"
        group.mkdir()
        return group
    except (OSError, StopIteration, IndexError):
        return None


def run_heldout(jsonl: Path, workers: int) -> dict:
    return _last_json_line([sys.executable, "-c", HELDOUT_RUNNER, str(jsonl), str(workers)], _heldout_env())


def _heldout_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def pipe_round_trip_seconds(trips: int = 2000) -> float:
    """One bare round trip between two processes over a pair of pipes (a byte each way), the
    best of three passes: what a per-input exchange costs before any harness."""
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the echo: answers each byte until the pipe closes
        os.close(down_w), os.close(up_r)
        while os.read(down_r, 1):
            os.write(up_w, b".")
        os._exit(0)
    os.close(down_r), os.close(up_w)
    best = float("inf")
    try:
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(trips):
                os.write(down_w, b".")
                os.read(up_r, 1)
            best = min(best, (time.perf_counter() - start) / trips)
    finally:
        os.close(down_w), os.close(up_r)
        os.waitpid(pid, 0)
    return best


def harness_floor(jsonl: Path, workers: int) -> dict:
    """heldout's floor on these problems (see the module docstring): the zero-work floor plus
    the programs' own work twice (expected outputs, candidate) over ``workers``; beside it, what
    the floor's round trips would cost as bare pipe round trips, and the zero-work floor again
    with one input per problem (what the executions cost whatever their inputs: the rest is
    the inputs' round trips)."""
    floor, one = (_last_json_line([sys.executable, "-c", FLOOR_RUNNER, str(jsonl), str(workers), *extra],
                                  _heldout_env()) for extra in ((), ("one",)))
    own = _last_json_line([sys.executable, "-c", OWN_WORK_RUNNER, str(jsonl)], _heldout_env())
    spread = 2 * own["seconds"] / workers
    return {"floor": floor["seconds"], "floor_inputs": floor["inputs_run"], "own": own["seconds"],
            "one_input": one["seconds"], "one_input_inputs": one["inputs_run"],
            "seconds": floor["seconds"] + spread, "pipe": pipe_round_trip_seconds()}


def run_evalplus(subset: Path, workers: int) -> dict | None:
    """evalplus on the problems of ``subset`` (see :func:`subset_files`), its ground-truth cache
    cleared first (cold, like heldout's run)."""
    try:
        import evalplus  # noqa: F401
    except ImportError:
        return None
    from evalplus.data.utils import CACHE_DIR

    samples = subset.parent / "samples.jsonl"
    samples.with_name("samples_eval_results.json").unlink(missing_ok=True)  # else evalplus asks to overwrite it
    for cached in Path(CACHE_DIR).glob("*.pkl") if Path(CACHE_DIR).is_dir() else []:
        cached.unlink()
    env = {**os.environ, "MBPP_OVERRIDE_PATH": str(subset)}
    return _last_json_line([sys.executable, "-c", EVALPLUS_RUNNER, str(samples), str(workers)], env)


def subset_files(jsonl: Path, limit: int | None, work: Path) -> tuple[Path, int]:
    """The first ``limit`` problems of the release file (None: all), their lines as they are, in
    ``work``/mbpp_plus.jsonl, and each one's canonical solution as a sample in
    ``work``/samples.jsonl: both sides read these in their timed windows. Returns the problems'
    file and their number."""
    lines = [line for line in jsonl.read_text(encoding="utf-8").splitlines() if line.strip()][:limit]
    subset = work / "mbpp_plus.jsonl"
    subset.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    samples = [json.dumps({"task_id": p["task_id"], "solution": p["prompt"] + p["canonical_solution"]})
               for p in map(json.loads, lines)]
    (work / "samples.jsonl").write_text("".join(line + "\n" for line in samples), encoding="utf-8")
    return subset, len(lines)


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


def measure(data_dir: str, workers: int = 2, limit: int | None = 30, with_floor: bool = False,
            rounds: int = 1) -> dict:
    """heldout, then ``rounds`` times evalplus and heldout again, on the first ``limit`` problems
    (None: all 378): each round's ratio is the mean of the heldout runs before and after its
    evalplus run over that run, and the figure is the median round (the machine's speed changes
    between runs; on 30 problems one round's ratio swings by 2x on this shared machine, and so
    does evalplus's own time). With ``with_floor``, heldout's floor (measured after the first
    evalplus run)."""
    work = Path(tempfile.mkdtemp(prefix="heldout-perf-mbpp-"))
    try:
        subset, n = subset_files(Path(data_dir) / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl", limit, work)
        runs, theirs_runs, bound = [run_heldout(subset, workers)], [], None
        for k in range(max(1, rounds)):
            theirs_runs.append(run_evalplus(subset, workers))
            if theirs_runs[-1] is None:
                break
            if with_floor and k == 0:
                bound = harness_floor(subset, workers)
            runs.append(run_heldout(subset, workers))
        if not theirs_runs[-1] and with_floor:
            bound = harness_floor(subset, workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    theirs_runs = [r for r in theirs_runs if r is not None]
    means = [(a["seconds"] + b["seconds"]) / 2 for a, b in zip(runs, runs[1:])] or [runs[0]["seconds"]]
    mine = {**runs[0], "seconds": statistics.median(means), "runs": [r["seconds"] for r in runs]}
    cpus = [r["cpu"] for r in runs if r.get("cpu") is not None]
    mine["cpu"] = sum(cpus) / len(cpus) if cpus else None
    mine["status"] = {t: [all(r["status"][t][i] for r in runs) for i in (0, 1)] for t in runs[0]["status"]}
    got = {"problems": n, "workers": workers, "heldout": mine, "evalplus": None, "floor": bound}
    if theirs_runs:
        their_cpus = [r["cpu"] for r in theirs_runs if r.get("cpu") is not None]
        got["evalplus"] = {**theirs_runs[0], "seconds": statistics.median(r["seconds"] for r in theirs_runs),
                           "runs": [r["seconds"] for r in theirs_runs],
                           "cpu": sum(their_cpus) / len(their_cpus) if their_cpus else None}
        got["differ"], got["right"] = differences(mine, theirs_runs[0])
        got["ratios"] = [m / t["seconds"] for m, t in zip(means, theirs_runs)]
        got["ratio"] = statistics.median(got["ratios"])
    return got


def cpu_text(got: dict) -> str:
    """Each side's machine CPU in its timed window (every process it started), and their ratio."""
    mine, theirs = got["heldout"]["cpu"], got["evalplus"]["cpu"]
    return (f"machine CPU in the timed window: heldout {mine:.2f} s, evalplus {theirs:.2f} s = {mine / theirs:.2f}x "
            f"(on {os.cpu_count()} cores, neither can take less wall time than its CPU / {os.cpu_count()})")


def floor_text(got: dict) -> str:
    """The floor's sentence: its parts in seconds, its ratio to evalplus's time, and what the
    same round trips cost bare. It names heldout's harness as the gap only when the numbers do:
    the floor alone is above evalplus's whole run while the bare round trips are far below it."""
    c, workers = got["floor"], got["workers"]
    bare = c["pipe"] * c["floor_inputs"] / workers
    text = (f"heldout's floor {c['seconds']:.2f} s = zero-work floor {c['floor']:.2f} s ({c['floor_inputs']} inputs, a "
            f"round trip each) + programs' own work 2 x {c['own']:.2f} s / {workers} workers")
    if got.get("evalplus"):
        reference = got["evalplus"]["seconds"]
        text += f" = {c['seconds'] / reference:.2f}x evalplus"
    extra_inputs = c["floor_inputs"] - c["one_input_inputs"]
    if extra_inputs > 0:
        per_input = max(0.0, c["floor"] - c["one_input"]) / extra_inputs * workers
        text += (f"; of the zero-work floor, {c['one_input']:.2f} s is its executions with one input each, then "
                 f"{per_input * 1e6:.0f} us of wall per further input and worker")
    if got.get("evalplus"):
        text += (f"; the same round trips over bare pipes ({c['pipe'] * 1e6:.0f} us each) would take {bare:.2f} s"
                 f" = {bare / reference:.2f}x")
        if c["floor"] > reference and bare < 0.5 * reference:
            part = "per execution" if c["one_input"] > c["floor"] / 2 else "per input"
            text += f": the gap is heldout's harness {part}, not the programs nor the pipe"
        if 2 * c["own"] / workers > c["floor"]:  # the programs outweigh the harness
            text += (f"; the programs alone bound the ratio at 2 / (workers + 1) = {2 / (workers + 1):.2f}x "
                     f"(evalplus's ground truth runs serially, its checks and both of heldout's passes over "
                     f"the workers)")
    return text


def figures(data_dir: str, workers: int = 2, limit: int | None = 30, rounds: int | None = None) -> list[dict]:
    """Rows for perf/run_all.py: heldout / evalplus wall time on the first ``limit`` problems
    (None: all 378), the median of ``rounds`` interleaved rounds (default: 5 on a subset, 1 on all
    378, where one round takes minutes and the machine's swings average out within it), target
    <= 1.0x at every size (issue 60), with every canonical solution passing in heldout and every
    difference from evalplus's verdicts named. Issue 19's 0.5x on all 378 is out of reach by the
    programs alone (2 / (workers + 1), see the module docstring): its bound is printed in the full
    row's floor, not used as its target."""
    if not (Path(data_dir) / "mbpp_plus" / "MbppPlus-v0.2.0.jsonl").is_file():
        return [{"name": "MBPP+", "value": float("nan"), "unit": "s", "ratio": float("nan"),
                 "target": "n/a", "passed": False, "note": f"no MBPP+ data under {data_dir}"}]
    rounds = rounds or (1 if limit is None else 5)
    got = measure(data_dir, workers, limit, with_floor=True, rounds=rounds)
    mine, theirs = got["heldout"], got["evalplus"]
    target = 1.0
    name = f"MBPP+ canonical run, {got['problems']} problems, {workers} workers (heldout / evalplus)"
    if theirs is None:
        return [{"name": name, "value": mine["seconds"], "unit": "s", "ratio": float("nan"),
                 "target": f"<= {target:g}x", "passed": False,
                 "note": "evalplus not installed (pip install heldout[evalplus])"}]
    return [{"name": name, "value": mine["seconds"], "unit": "s", "ratio": got["ratio"],
             "target": f"<= {target:g}x evalplus", "passed": got["ratio"] <= target and got["right"],
             "note": f"{runs_text(got)}; verdicts {verdicts_text(got)}"
                     + (f"; {cpu_text(got)}" if mine.get("cpu") is not None and theirs.get("cpu") else "")
                     + (f"; {floor_text(got)}" if got["floor"] else "")}]


def runs_text(got: dict) -> str:
    """Every run's seconds in the order they ran, and each round's ratio (the figure is their median)."""
    mine, theirs = got["heldout"]["runs"], got["evalplus"]["runs"]
    order = [f"heldout {mine[0]:.2f}"] + [f"evalplus {t:.2f}, heldout {m:.2f}" for t, m in zip(theirs, mine[1:])]
    return (f"runs in order (s): {'; '.join(order)}; round ratios {' '.join(f'{r:.2f}' for r in got['ratios'])} "
            f"(median {got['ratio']:.2f}x, load {os.getloadavg()[0]:.1f} at the end)")


def verdicts_text(got: dict) -> str:
    mine = got["heldout"]
    return (("identical" if not got["differ"] else "differ on " + ", ".join(got["differ"]))
            + f" (heldout base {mine['base']}, plus {mine['plus']}"
            + ("" if got["right"] else ": NOT every canonical solution passes") + ")")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="only the first N problems")
    ap.add_argument("--rounds", type=int, default=1, help="evalplus runs, each between two heldout runs")
    args = ap.parse_args()
    got = measure(args.data_dir, args.workers, args.limit, with_floor=True, rounds=args.rounds)
    mine, theirs, n = got["heldout"], got["evalplus"], got["problems"]
    print(f"problems: {n}, workers: {args.workers}")
    print(f"heldout  (sandboxed): {mine['seconds']:8.2f} s   base {mine['base']}/{n}  plus {mine['plus']}/{n}")
    if theirs is None:
        print("evalplus not installed: no reference (pip install heldout[evalplus])")
        return
    print(f"evalplus (its own):   {theirs['seconds']:8.2f} s   base {theirs['base']}/{theirs['n']}  "
          f"plus {theirs['plus']}/{theirs['n']}")
    print(runs_text(got))
    print("verdicts: " + verdicts_text(got))
    print(f"ratio heldout / evalplus = {got['ratio']:.2f}x (goal at most 1.0x evalplus)")
    if mine.get("cpu") is not None and theirs.get("cpu"):
        print(cpu_text(got))
    if got["floor"]:
        print(floor_text(got))


if __name__ == "__main__":
    main()
