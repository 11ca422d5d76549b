"""Two grids on Ray, each against a local reference measured in the same run: how much Ray gains
where cells wait, and what it costs where they compute.

1. **Latency-bound prompt cells.** ``bbh/boolean_expressions`` [cpu-demo] x ``seed`` x 8 seeds,
   the worker model a loopback test server whose every answer takes 100 ms
   (``TestServer(latency=0.1)``), one call in flight per cell (``model_concurrency=1``) and no
   response cache, so each cell's 24 test calls are ~2.4 s of waiting and ~0.3 s of CPU. Serial
   (``LocalExecutor(1)``) against Ray on a ``ray.cluster_utils.Cluster`` (a head with no CPUs and
   two one-CPU worker nodes, each its own raylet and workers), every cell asking 1 CPU, so one
   cell runs per node: parallelism 2. Target: Ray >= 1.8x serial (the ceiling is 2x).
2. **CPU-bound program cells.** ``circle_packing/square26`` x ``local-search`` x 4 seeds (each
   cell runs its 120 candidates in the sandbox: CPU-bound, no model). Ray (a local
   ``ray.init(num_cpus=2)``, every cell asking 1 CPU, so two run at once) against a local
   process pool at the same parallelism (``LocalExecutor(2)``). Target: Ray >= 0.95x the pool's
   speed (ratio = pool seconds / Ray seconds). Beside it, the ceiling of any 2-way grid of such
   cells on this machine: 2 / (cores one cell keeps busy), measured on one serial cell as the CPU
   seconds of the whole process tree over its wall seconds. ``getrusage`` (self + reaped
   children) alone misses the sandboxed children, which the long-lived fork server reaps, not
   us; so the CPU of every live descendant (``/proc/PID/stat``: its own time plus what it reaped)
   is added, and both figures are printed. On 2 cores one such cell keeps ~1.4 cores busy (the
   harness, the sandboxed child, the fork server), so the ceiling is ~1.44x over serial: a
   ">= 1.8x over serial" target for CPU-bound cells is above what 2 cores can give.

Start-up is not in any figure (a cluster is started once per study, not per cell): the serial
process, the local pool's parent and every Ray worker are warmed up on a throw-away grid first.
The pool's workers, though, are forked afresh for each study (as ``heldout run --jobs 2`` does)
and each starts its own fork server inside the timed run, while the warmed Ray workers already
have theirs: that start-up counts against the pool only.
The reference (serial, or the pool) runs before and after Ray and its figure is the mean of the
two, so that a change of the machine's speed during the run (ours swings by up to 2x within
minutes) does not favour either side. Records of both sides are compared: the same test scores,
else the row fails.

    python perf/ray_grid.py [--prompt-seeds 8] [--program-seeds 4] [--budget 120]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from heldout.models.testserver import TestServer  # noqa: E402
from heldout.protocols.executors import FORWARDED_ENV, CellResources, RayExecutor  # noqa: E402
from heldout.protocols.run import LocalExecutor, StudyConfig, build_cells, run_study  # noqa: E402
from heldout.protocols.study import parse_methods  # noqa: E402
from machine import verdict  # noqa: E402

PROMPT_TASK, PROMPT_PROFILE, PROMPT_METHOD, PROMPT_BUDGET = "bbh/boolean_expressions", "cpu-demo", "seed", 8
LATENCY = 0.1
PROMPT_TARGET = 1.8
PROGRAM_TASK, PROGRAM_METHOD = "circle_packing/square26", "local-search"
PROGRAM_TARGET = 0.95
PARALLELISM = 2
NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _grid(task: str, method: str, profile: str, seeds: int, budget: int, first_seed: int = 0):
    return build_cells([task], parse_methods([method], []), list(range(first_seed, first_seed + seeds)),
                       {task: budget}, profile, {})


def _timed(cells, config: StudyConfig, executor) -> tuple[list, float]:
    t0 = time.perf_counter()
    records = run_study(cells, config, executor, progress=False)
    return records, time.perf_counter() - t0


def _scores(records: list) -> list:
    return sorted((r["seed"], r["status"], r["test_score"]) for r in records)


def _worker_env() -> dict:
    """What a Ray worker needs from this driver (RayExecutor forwards it only when it starts Ray
    itself; here Ray is initialised first, so the warm-up and the measured grid share workers)."""
    env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
    return {"env_vars": {**env, "PYTHONPATH": str(HERE.parent)}}


# -- the cores one cell keeps busy --------------------------------------------------------------
def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _live_cpu(pid: int) -> float:
    """utime + stime + cutime + cstime of a live process (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS


def _cpu_seconds() -> tuple[float, float]:
    """(getrusage self + reaped children, that plus every live descendant's own and reaped CPU)."""
    me, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    rusage = me.ru_utime + me.ru_stime + reaped.ru_utime + reaped.ru_stime
    return rusage, rusage + sum(_live_cpu(pid) for pid in _descendants(os.getpid()))


def cores_of_one_cell(cell, root: Path) -> dict:
    """Cores one serial cell keeps busy: CPU seconds of the process tree / wall seconds."""
    before = _cpu_seconds()
    _, wall = _timed([cell], StudyConfig(run_root=str(root)), LocalExecutor(1))
    after = _cpu_seconds()
    return {"wall_s": wall, "rusage_cores": (after[0] - before[0]) / wall, "cores": (after[1] - before[1]) / wall}


# -- the two grids ------------------------------------------------------------------------------
def measure_prompt(seeds: int = 8) -> dict:
    """Latency-bound prompt cells: serial vs Ray on two one-CPU nodes (a cell asks 1 CPU)."""
    import ray
    from ray.cluster_utils import Cluster

    root = Path(tempfile.mkdtemp(prefix="heldout-perf-ray-prompt-"))
    cells = _grid(PROMPT_TASK, PROMPT_METHOD, PROMPT_PROFILE, seeds, PROMPT_BUDGET)
    warm = _grid(PROMPT_TASK, PROMPT_METHOD, PROMPT_PROFILE, 4, PROMPT_BUDGET, first_seed=100)
    try:
        with TestServer(latency=LATENCY) as server:
            def config(name: str) -> StudyConfig:
                return StudyConfig(run_root=str(root / name), worker_model="test", base_url=server.base_url,
                                   cache_dir=None, model_concurrency=1)

            def serial(name: str) -> tuple[list, float, int]:
                calls = server.stats.calls
                records, seconds = _timed(cells, config(name), LocalExecutor(1))
                return records, seconds, server.stats.calls - calls

            _timed(warm[:2], config("serial-warm"), LocalExecutor(1))
            first, first_s, calls = serial("serial")
            nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                                  "object_store_memory": 80 * 2**20})
            try:
                for _ in range(PARALLELISM):
                    nodes.add_node(**NODE)
                nodes.wait_for_nodes()
                ray.init(address=nodes.address, log_to_driver=False, runtime_env=_worker_env())
                try:
                    one_cpu = CellResources(cpus=1)
                    # 4 cells of ~2.6 s on 2 one-CPU nodes: each node's worker runs (and warms on) some
                    _timed(warm, config("ray-warm"), RayExecutor(root / "ray-warm", address=nodes.address,
                                                                 resources=one_cpu))
                    distributed, ray_s = _timed(cells, config("ray"), RayExecutor(root / "ray", address=nodes.address,
                                                                                  resources=one_cpu))
                finally:
                    ray.shutdown()
            finally:
                nodes.shutdown()
            second, second_s, _ = serial("serial-again")
        serial_s = (first_s + second_s) / 2
        same = _scores(first) == _scores(distributed) == _scores(second) and all(r["status"] == "ok" for r in first)
        return {"cells": len(cells), "serial_s": serial_s, "serial_runs": [first_s, second_s], "ray_s": ray_s,
                "speedup": serial_s / ray_s, "calls": calls, "latency_floor_s": calls * LATENCY, "same_scores": same}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure_program(seeds: int = 4, budget: int = 120) -> dict:
    """CPU-bound program cells: a local pool of 2 vs Ray with 2 CPUs (a cell asks 1 CPU), and the
    ceiling 2 / (cores one serial cell keeps busy)."""
    import ray

    root = Path(tempfile.mkdtemp(prefix="heldout-perf-ray-program-"))
    cells = _grid(PROGRAM_TASK, PROGRAM_METHOD, "default", seeds, budget)
    warm = _grid(PROGRAM_TASK, PROGRAM_METHOD, "default", 4, 10, first_seed=100)
    try:
        # warm this process (imports, fork server): the pool's workers are forked from it
        _timed(warm, StudyConfig(run_root=str(root / "serial-warm")), LocalExecutor(1))
        _timed(warm, StudyConfig(run_root=str(root / "pool-warm")), LocalExecutor(PARALLELISM))
        one = cores_of_one_cell(cells[0], root / "one-cell")

        def pool(name: str) -> tuple[list, float]:
            return _timed(cells, StudyConfig(run_root=str(root / name)), LocalExecutor(PARALLELISM))

        first, first_s = pool("pool")
        ray.init(address="local", num_cpus=PARALLELISM, include_dashboard=False, log_to_driver=False,
                 object_store_memory=80 * 2**20, runtime_env=_worker_env())
        try:
            one_cpu = CellResources(cpus=1)
            # every worker warm (imports, fork server): cells long enough that one worker cannot
            # take them all while the other is still starting
            _timed(warm, StudyConfig(run_root=str(root / "ray-warm")), RayExecutor(root / "ray-warm", resources=one_cpu))
            distributed, ray_s = _timed(cells, StudyConfig(run_root=str(root / "ray")),
                                        RayExecutor(root / "ray", resources=one_cpu))
        finally:
            ray.shutdown()
        second, second_s = pool("pool-again")
        pool_s = (first_s + second_s) / 2
        same = _scores(first) == _scores(distributed) == _scores(second) and all(r["status"] == "ok" for r in first)
        return {"cells": len(cells), "pool_s": pool_s, "pool_runs": [first_s, second_s], "ray_s": ray_s,
                "ratio": pool_s / ray_s, "same_scores": same, "one_cell": one, "ceiling": PARALLELISM / one["cores"]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def rows(prompt: dict, program: dict) -> list[dict]:
    load = os.getloadavg()[0]
    one = program["one_cell"]
    return [
        {"name": f"ray prompt grid, latency-bound ({prompt['cells']} cells, 2 one-CPU nodes)",
         "value": prompt["ray_s"], "unit": "s", "ratio": prompt["speedup"],
         "target": f">= {PROMPT_TARGET}x over serial ({prompt['serial_s']:.1f} s)",
         "passed": prompt["speedup"] >= PROMPT_TARGET and prompt["same_scores"],
         "note": f"serial {' and '.join(f'{s:.1f}' for s in prompt['serial_runs'])} s before and after Ray "
                 f"({prompt['calls']} calls of {LATENCY * 1000:.0f} ms, one in flight: {prompt['latency_floor_s']:.1f} s "
                 f"of waiting); ceiling {PARALLELISM}x; load {load:.2f}; "
                 + ("same test scores" if prompt["same_scores"] else "TEST SCORES DIFFER")},
        {"name": f"ray program grid, CPU-bound ({program['cells']} cells, 2 CPUs) vs local pool of 2",
         "value": program["ray_s"], "unit": "s", "ratio": program["ratio"],
         "target": f">= {PROGRAM_TARGET}x pool speed ({program['pool_s']:.1f} s)",
         "passed": program["ratio"] >= PROGRAM_TARGET and program["same_scores"],
         "note": f"pool {' and '.join(f'{s:.1f}' for s in program['pool_runs'])} s before and after Ray; "
                 f"ceiling over serial 2/{one['cores']:.2f} = {program['ceiling']:.2f}x (one serial cell "
                 f"{one['wall_s']:.1f} s: CPU of the process tree / wall = {one['cores']:.2f} cores; getrusage "
                 f"self+children alone {one['rusage_cores']:.2f}, the fork server's reaped children added from "
                 f"/proc); load {load:.2f}; " + ("same test scores" if program["same_scores"] else "TEST SCORES DIFFER")},
    ]


def measured_rows(prompt_seeds: int = 8, program_seeds: int = 4, budget: int = 120) -> list[dict]:
    """Both rows, measured in this process."""
    return rows(measure_prompt(prompt_seeds), measure_program(program_seeds, budget))


def figures(prompt_seeds: int = 8, program_seeds: int = 4, budget: int = 120) -> list[dict]:
    """Rows for perf/run_all.py, measured in a fresh interpreter: the local pool forks its workers,
    and a process that has run Ray before (an earlier repeat of run_all) forks workers that die
    (BrokenProcessPool, seen in 2 of 3 repeats when measured in run_all's own process)."""
    with tempfile.TemporaryDirectory(prefix="heldout-perf-ray-rows-") as folder:
        out = Path(folder) / "rows.json"
        done = subprocess.run([sys.executable, __file__, "--prompt-seeds", str(prompt_seeds), "--program-seeds",
                               str(program_seeds), "--budget", str(budget), "--rows-json", str(out)],
                              capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"perf/ray_grid.py exited {done.returncode}: {done.stderr.strip()[-500:]}")
        return json.loads(out.read_text())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-seeds", type=int, default=8)
    parser.add_argument("--program-seeds", type=int, default=4)
    parser.add_argument("--budget", type=int, default=120, help="metric calls of a program cell")
    parser.add_argument("--rows-json", default=None, help="write the rows here (what run_all reads)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    measured = measured_rows(args.prompt_seeds, args.program_seeds, args.budget)
    if args.rows_json:
        Path(args.rows_json).write_text(json.dumps(measured))
    for row in measured:
        print(f"{row['name']}: {row['value']:.2f} {row['unit']}, ratio {row['ratio']:.2f} (target {row['target']}) "
              f"{verdict(row['passed'])}\n    {row['note']}")
    print(f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; "
          f"{time.perf_counter() - started:.0f} s")
