"""A paper-sized study on one machine: what heldout costs per metric call, and how it grows (issue 60).

The SEPO comparison's shape: the SEPO suite's prompt tasks that heldout ships with a ``sepo``
profile (the eight of ``bbh/sepo``, gsm_hard, hotpotqa/distractor, mmlu_pro/psychology: MBPP+,
the twelfth, runs candidates in the sandbox and is measured by perf/mbpp_plus_run.py) x five
methods (the reference optimizers reflective and placebo; the libraries GEPA, DSPy's MIPROv2 and
DSPy's GEPA through their adapters) x 3 seeds x 2,000 metric calls, plus held-out scoring:
``heldout run`` of a study file against the chain-of-thought loopback server (perf/cot_server.py:
200-600 tokens of reasoning before each answer), ``--latency`` seconds per answer, concurrency 16,
``--jobs`` sessions at a time.

``--scale S`` (repeatable; 0 < S <= 1) runs S of the study's metric calls: ceil(11 S) tasks, each
cell's budget 2,000 x S x 11 / tasks (every cell keeps its full held-out scoring, so a small scale
holds more than S of the entries). At each scale the run is killed with SIGKILL once all but
``--jobs`` cells have finished and resumed with ``--resume``; then every command that reads the
whole study runs on it in a fresh interpreter, with its wall time and peak memory (its own
``wait4`` rusage): ``heldout report``, ``heldout check`` (the study against itself, one method),
``heldout runs query`` (over the runs table, and over every ledger entry), ``heldout verify``. It
prints, each beside the reference measured in the same run:

* the protected path (perf/protected_path.py): a session's wall and CPU per metric call against
  the bare ModelClient sending the same requests, at 0 and 50 ms latency;
* the study's CPU per metric call (every process of ``heldout run``) against the bare client's;
* ledger bytes per entry, against the bytes of the model outputs the ledger records (every
  evaluation's and held-out scoring's), and against the same entries written unpacked (as before
  packing: the reference);
* each reading command's wall and peak memory at each scale, and its growth exponent (the
  log-log slope of wall, and of memory, against the study's ledger entries; target <= 1.1), with
  peak memory against the machine's.

    python perf/paper_study.py --scale 0.01 --scale 0.03 --scale 0.1 [--latency 0.05] [--jobs 2]
        [--root /tmp/paper-study] [--data-dir ../shared/data] [--json out.json]

At full scale it runs about 330,000 metric calls and may take hours on two busy cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's heldout and the sibling scripts

import protected_path  # noqa: E402
from machine import fixed_loop_seconds, verdict  # noqa: E402

TASKS = ("bbh/boolean_expressions", "bbh/causal_judgement", "bbh/date_understanding", "bbh/disambiguation_qa",
         "bbh/dyck_languages", "bbh/formal_fallacies", "bbh/geometric_shapes", "bbh/hyperbaton",
         "gsm_hard", "hotpotqa/distractor", "mmlu_pro/psychology")
METHODS = ("reflective", "placebo", "gepa", "dspy-mipro", "dspy-gepa")
SEEDS = (0, 1, 2)
FULL_BUDGET = 2000
TARGET_EXPONENT = 1.1
READERS = ("report", "check", "runs query", "runs query (ledger)", "verify")


def study_file(root: Path, scale: float, base_url: str, jobs: int, data_dir: str) -> tuple[Path, int, int]:
    """The study at ``scale``: (file, tasks, budget per cell)."""
    tasks = TASKS[:max(1, math.ceil(len(TASKS) * scale))]
    budget = max(1, round(FULL_BUDGET * scale * len(TASKS) / len(tasks)))
    methods = "\n".join(f'[[methods]]\nname = "{m}"\n' for m in METHODS)
    text = (f'run_dir = "{root / "runs"}"\ndata_dir = "{data_dir}"\ntasks = {json.dumps(list(tasks))}\nprofiles = ["sepo"]\n'
            f"seeds = {list(SEEDS)}\nbudget = {budget}\n\n[models]\nworker = \"test-model\"\n"
            f'architect = "test-model"\nbase_url = "{base_url}"\n\n[executor]\nkind = "local"\njobs = {jobs}\n\n'
            f"{methods}")
    path = root / "study.toml"
    path.write_text(text)
    return path, len(tasks), budget


def heldout(*args: str, kill_when=None) -> dict:
    """``python -m heldout ARGS`` in a fresh interpreter (its own process group): wall, CPU and peak
    RSS of it and every process it waited for (``wait4``). ``kill_when()`` polled every 0.5 s: when
    true, the whole group gets SIGKILL."""
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}  # the heldout beside this script, not the installed one
    proc = subprocess.Popen([sys.executable, "-m", "heldout", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, env=env)
    out = bytearray()
    os.set_blocking(proc.stdout.fileno(), False)
    killed = False
    seen: dict[int, float] = {}  # pid -> CPU seconds last read: a killed pool is never waited for
    while True:
        chunk = proc.stdout.read()
        if chunk:
            out.extend(chunk)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if kill_when is not None:
            seen.update(group_cpu(proc.pid))
            if not killed and kill_when():
                os.killpg(proc.pid, signal.SIGKILL)  # the harness and its pool, as a crash would take them
                killed = True
        time.sleep(0.5)
    out.extend(proc.stdout.read() or b"")
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = sum(seen.values()) if killed else usage.ru_utime + usage.ru_stime
    return {"wall": time.perf_counter() - started, "cpu": cpu, "peak_mb": usage.ru_maxrss / 1024,
            "exit": proc.returncode, "killed": killed, "tail": out.decode(errors="replace")[-1500:]}


def group_cpu(session: int) -> dict[int, float]:
    """CPU seconds (user + system) of every live process of session ``session``, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # field 6 of stat: the session id
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


REQUEST_KINDS = ("evaluation", "val_scoring", "test_scoring", "architect_call")  # entries that were a model request


def output_bytes(data: object) -> int:
    """The UTF-8 bytes of the model output an entry records (its verdict's ``output``), 0 if none."""
    verdict = data.get("verdict") if isinstance(data, dict) else None
    output = verdict.get("output") if isinstance(verdict, dict) else None
    if output is None:
        return 0
    return len((output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)).encode())


def ledger_figures(runs: Path) -> dict:
    """Entries and bytes over every ledger of the study, as read back (packed outputs put back);
    the bytes the same entries take as lines written unpacked (the ledger before issue 60's
    packing); the model requests they record (a memo hit counts too: an upper bound); the bytes of
    the outputs the evaluations record, and of every output recorded (evaluations and held-out
    scoring); the run records' bytes."""
    from heldout.evaluators.ledger import read_entries
    figures = dict.fromkeys(("entries", "evaluations", "requests", "bytes", "unpacked_bytes", "output_bytes",
                             "all_output_bytes", "record_bytes"), 0)
    for ledger in runs.rglob("ledger.jsonl"):
        figures["bytes"] += ledger.stat().st_size
        record = ledger.parent / "run_record.json"
        figures["record_bytes"] += record.stat().st_size if record.exists() else 0
        for entry in read_entries(ledger)[0]:
            figures["entries"] += 1
            figures["unpacked_bytes"] += len(json.dumps(entry, sort_keys=True, ensure_ascii=False).encode()) + 1
            figures["requests"] += entry["kind"] in REQUEST_KINDS
            recorded = output_bytes(entry["data"])
            figures["all_output_bytes"] += recorded
            if entry["kind"] == "evaluation":
                figures["evaluations"] += 1
                figures["output_bytes"] += recorded
    return figures


def run_scale(scale: float, root: Path, base_url: str, jobs: int, data_dir: str) -> dict:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    study, tasks, budget = study_file(root, scale, base_url, jobs, data_dir)
    cells = tasks * len(METHODS) * len(SEEDS)
    runs = root / "runs"

    def nearly_done() -> bool:  # all but the cells in flight have records, and those are mid-way
        finished = sum(1 for _ in runs.rglob("run_record.json"))
        return finished >= cells - jobs and any(
            p.stat().st_size > 0 for p in runs.rglob("ledger.jsonl") if not (p.parent / "run_record.json").exists())

    first = heldout("run", str(study), kill_when=nearly_done)
    if first["exit"] != 0 and not first["killed"]:
        raise SystemExit(f"the study failed at scale {scale}: {first['tail']}")
    resume = heldout("run", str(study), "--resume")
    if resume["exit"] != 0:
        raise SystemExit(f"the resumed study failed at scale {scale}: {resume['tail']}")
    result = {"scale": scale, "tasks": tasks, "budget": budget, "cells": cells, "run": first, "resume": resume,
              "ledger": ledger_figures(runs)}
    out = root / "report"
    result["report"] = heldout("report", str(runs), "--out", str(out))
    result["check"] = heldout("check", "--baseline", str(runs), "--current", str(runs), "--method", METHODS[0])
    result["runs query"] = heldout("runs", "query", str(runs), "SELECT task, method, avg(test_score) FROM runs GROUP BY ALL")
    result["runs query (ledger)"] = heldout("runs", "query", str(runs),
                                            "SELECT kind, count(*), sum(length(data::VARCHAR)) FROM ledger GROUP BY ALL")
    result["verify"] = heldout("verify", str(runs), "--data-dir", data_dir)
    for name in READERS:
        if result[name]["exit"] not in (0, 1):  # check and verify say 1 for a verdict, never for a crash
            raise SystemExit(f"heldout {name} failed at scale {scale}: {result[name]['tail']}")
    return result


def slope(xs: list[float], ys: list[float]) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0]) if len(xs) >= 2 else math.nan


def figures(scales: list[float], root: Path, latency: float, jobs: int, data_dir: str,
            with_protected: bool = True) -> tuple[list[dict], list[dict]]:
    """(rows, per-scale results)."""
    rows: list[dict] = []
    bare_cpu_per_call = math.nan
    if with_protected:
        for lat in (0.0, 0.05):
            m = protected_path.measure(lat, data_dir)
            rows.extend(protected_path.rows_of(m))
            if lat == latency or math.isnan(bare_cpu_per_call):
                bare_cpu_per_call = m["bare_cpu"] / m["requests"]
    proc, base_url = protected_path.start_cot_server(latency)
    results = []
    try:
        for scale in scales:
            t0 = time.perf_counter()
            results.append(run_scale(scale, root / f"scale-{scale:g}", base_url, jobs, data_dir))
            print(f"[scale {scale:g}: {time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    machine_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 20
    for r in results:
        led, n = r["ledger"], r["ledger"]["entries"]
        requests = led["requests"]
        cpu = r["run"]["cpu"] + r["resume"]["cpu"]
        label = f"paper study {r['scale']:g} ({r['cells']} cells x {r['budget']} calls)"
        rows.append({"name": f"{label}: CPU per metric call", "value": 1000 * cpu / max(1, requests), "unit": "ms",
                     "ratio": cpu / max(1, requests) / bare_cpu_per_call, "target": "x bare ModelClient CPU per request",
                     "passed": None,
                     "note": f"heldout run {r['run']['wall'] + r['resume']['wall']:.0f} s wall, {cpu:.0f} s CPU (every "
                             f"process) over {requests} model requests ({led['evaluations']} evaluations, held-out "
                             f"scoring, architect calls); {n} ledger entries"})
        rows.append({"name": f"{label}: ledger bytes per entry", "value": led["bytes"] / n, "unit": "B",
                     "ratio": led["bytes"] / max(1, led["all_output_bytes"]), "target": "x the model outputs it records",
                     "passed": None,
                     "note": f"{led['bytes'] / 2 ** 20:.1f} MiB over {n} entries ({led['evaluations']} evaluations); "
                             f"outputs {led['all_output_bytes'] / 2 ** 20:.1f} MiB in all, "
                             f"{led['output_bytes'] / max(1, led['evaluations']):.0f} B per evaluation"})
        rows.append({"name": f"{label}: ledger bytes, packed / unpacked", "value": led["unpacked_bytes"] / n,
                     "unit": "B", "ratio": led["bytes"] / max(1, led["unpacked_bytes"]),
                     "target": "x the same entries stored unpacked", "passed": None,
                     "note": f"unpacked (as written before packing) {led['unpacked_bytes'] / 2 ** 20:.1f} MiB; "
                             f"run records {led['record_bytes'] / 2 ** 20:.1f} MiB beside the ledgers"})
        for name in ("resume",) + READERS:
            got = r[name]
            rows.append({"name": f"{label}: heldout {name}", "value": got["wall"], "unit": "s",
                         "ratio": got["peak_mb"] / machine_mb, "target": "peak memory / the machine's",
                         "passed": got["peak_mb"] < machine_mb / 2,
                         "note": f"peak {got['peak_mb']:.0f} MB, CPU {got['cpu']:.1f} s, exit {got['exit']}"})
    if len(results) >= 2:
        sizes = [r["ledger"]["entries"] for r in results]
        for name in ("resume",) + READERS:
            walls, peaks = [r[name]["wall"] for r in results], [r[name]["peak_mb"] for r in results]
            k = slope(sizes, walls)
            rows.append({"name": f"paper study growth: heldout {name}", "value": k, "unit": "", "ratio": k,
                         "target": f"exponent <= {TARGET_EXPONENT} (wall vs ledger entries)",
                         "passed": k <= TARGET_EXPONENT,
                         "note": f"{sizes[0]} -> {sizes[-1]} entries: {walls[0]:.1f} -> {walls[-1]:.1f} s; memory "
                                 f"exponent {slope(sizes, peaks):.2f} ({peaks[0]:.0f} -> {peaks[-1]:.0f} MB)"})
    return rows, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, action="append", help="share of the study, 0 < S <= 1 (repeatable)")
    parser.add_argument("--latency", type=float, default=0.05, help="the study's model latency, seconds")
    parser.add_argument("--jobs", type=int, default=2, help="sessions in parallel")
    parser.add_argument("--root", default=None, help="where the studies go (each scale's folder emptied first)")
    parser.add_argument("--data-dir", default=os.environ.get("HELDOUT_DATA_DIR", str(HERE.parent.parent / "shared" / "data")))
    parser.add_argument("--no-protected", action="store_true", help="skip the protected-path rows")
    parser.add_argument("--json", help="also write the rows and per-scale results here")
    args = parser.parse_args(argv)
    scales = sorted(args.scale or [0.01, 0.03])
    if any(not 0 < s <= 1 for s in scales):
        print(f"paper_study: every --scale is in (0, 1], got {scales}", file=sys.stderr)
        return 2
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="heldout-paper-study-"))
    loop, load = fixed_loop_seconds(), os.getloadavg()[0]
    started = time.perf_counter()
    rows, results = figures(scales, root, args.latency, args.jobs, args.data_dir, not args.no_protected)
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['value']:>9.3f} {r['unit']:<3} {r['ratio']:>7.2f}  {r['target']:<45} "
              f"{verdict(r['passed']):<5} {r['note']}")
    print(f"\nfixed loop {loop:.3f} s before, {fixed_loop_seconds():.3f} s after; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; {os.cpu_count()} cores; total {time.perf_counter() - started:.0f} s; "
          f"studies in {root}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "results": results}, indent=1, default=str))
    judged = [r for r in rows if r["passed"] is not None]
    return 0 if all(r["passed"] for r in judged) else 1


if __name__ == "__main__":
    sys.exit(main())
