"""The protected path against the bare client: what heldout adds to each metric call (issue 60).

An optimizer evaluates a new candidate on batches of 50 train examples through a real
:class:`~heldout.Session` (budget, visibility, scoring, a hash-chained ledger on disk, signatures),
then the session scores its final candidate on val and test: 800 worker requests on
bbh/word_sorting, answered by the chain-of-thought loopback server (perf/cot_server.py: 200-600
tokens of reasoning before each answer) at a given latency. The reference, measured in the same
run, is heldout's own :class:`~heldout.models.ModelClient` sending exactly the requests the
session sent, in the same batches, and nothing else. Session, bare, session, bare: each figure
is the mean of its two runs, so a change of load during the run hits both.

Targets (issue 60): session wall within 1.3x of the bare client's at 0 ms latency, 1.10x at 50 ms
and concurrency 16. The *floor* is the same requests with only the work the protected path cannot
drop (each output scored and its verdict appended to a real ledger's batch as it arrives, each
batch one write, fsync and head): how close to the bare client any session can come on this machine. CPU per metric call is this process's CPU time (every thread) over the
requests; the server's CPU is its own process's.

    python perf/protected_path.py [--latency 0 --latency 0.05] [--data-dir ../shared/data] [--profile out.prof]
    python perf/protected_path.py --work   # the floor's own work alone, CPU per output

``--work`` measures, without the network, the two things each output costs the protected path
whatever the endpoint (what the floor adds to the bare client): scoring it, and appending its
evaluation entry to a real ledger in batches of 50, on the outputs of one session's 600
evaluations; CPU time per output, best of five (every process's load inflates it alike).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's heldout and the sibling scripts

from heldout import Session, SessionModels, load_task  # noqa: E402
from heldout.contracts import candidate_id  # noqa: E402
from heldout.evaluators.ledger import Ledger  # noqa: E402
from heldout.evaluators.scoring import InOrder  # noqa: E402
from heldout.models import ChatRequest, ModelClient  # noqa: E402
from cores import CoreMeter, Cores, cpu_bound_seconds, mean_cores  # noqa: E402
from machine import verdict  # noqa: E402

TASK, PROFILE = "bbh/word_sorting", "default"  # 50 train / 50 val / 150 test
BATCH, ROUNDS, CONCURRENCY = 50, 12, 16  # 600 metric calls + 200 held-out = 800 requests
TARGETS = {0.0: 1.3, 0.05: 1.10}


def start_cot_server(latency: float) -> tuple[subprocess.Popen, str]:
    """perf/cot_server.py in its own process; (process, base URL)."""
    proc = subprocess.Popen([sys.executable, str(HERE / "cot_server.py"), "--latency", str(latency)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise SystemExit(f"chain-of-thought server did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1].strip()


class RecordingClient(ModelClient):
    """The session's worker: a ModelClient that keeps each batch it was asked to send (a list
    reference per batch, nothing copied), so the bare run sends exactly the same. The session asks
    for its answers as they arrive (``complete_each``); the bare client waits for each batch whole."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[list[ChatRequest]] = []

    def complete_each(self, requests):
        self.batches.append(list(requests))
        return super().complete_each(requests)


def batch_optimizer(view, seed):
    """A new instruction on every batch of 50 train examples until the budget is spent; the last is final."""
    candidate = dict(view.seed_candidate)
    for r in range(view.remaining // BATCH):
        candidate = {**view.seed_candidate, "instruction": f"{view.seed_candidate.get('instruction', '')} (variant {r})"}
        view.evaluate(candidate, "train", [ex["id"] for ex in view.train[:BATCH]])
    return candidate


@dataclass
class Timed:
    wall: float
    cpu: float
    requests: int
    ledger_bytes: int = 0
    ledger_entries: int = 0
    cores: Cores | None = None  # cores busy over the run (perf/cores.py)


def run_session(base_url: str, task, run_dir: Path, profiler: cProfile.Profile | None = None,
                server_pid: int | None = None) -> tuple[Timed, list]:
    worker = RecordingClient("test-model", base_url, concurrency=CONCURRENCY)
    try:
        with CoreMeter(server_pid) as meter:
            wall, cpu = time.perf_counter(), time.process_time()
            if profiler is not None:
                profiler.enable()
            session = Session(task, PROFILE, budget=BATCH * ROUNDS, seed=0, models=SessionModels(worker=worker),
                              run_dir=run_dir, method="perf-batches")
            record = session.run(batch_optimizer)
            if profiler is not None:
                profiler.disable()
            timed = Timed(time.perf_counter() - wall, time.process_time() - cpu, sum(map(len, worker.batches)))
        timed.cores = meter.cores
    finally:
        worker.close()
    if record.status != "ok":
        raise SystemExit(f"the session did not finish: {record.status} {record.error}")
    timed.ledger_bytes = (run_dir / "ledger.jsonl").stat().st_size
    timed.ledger_entries = record.ledger_entries
    return timed, worker.batches


def run_bare(base_url: str, batches: list[list[ChatRequest]], server_pid: int | None = None) -> Timed:
    with ModelClient("test-model", base_url, concurrency=CONCURRENCY) as client, CoreMeter(server_pid) as meter:
        wall, cpu = time.perf_counter(), time.process_time()
        for batch in batches:
            client.complete_many(batch)
        timed = Timed(time.perf_counter() - wall, time.process_time() - cpu, sum(map(len, batches)))
    timed.cores = meter.cores
    return timed


def scored_examples(task, batches: list[list[ChatRequest]]) -> list[list]:
    """The example of each request the session sent, batch by batch: the optimizer's batches of
    train examples, then val and test in order (the held-out scoring's chunks)."""
    order = [ex for _ in range(ROUNDS) for ex in task.splits["train"][:BATCH]] + task.splits["val"] + task.splits["test"]
    out, k = [], 0
    for batch in batches:
        out.append(order[k:k + len(batch)])
        k += len(batch)
    for batch, examples in zip(batches, out):  # the order above is the session's: checked, not assumed
        for request, ex in zip(batch, examples):
            if ex.input["question"] not in request.messages[-1]["content"]:
                raise SystemExit(f"request and example {ex.id} disagree: the session's order changed")
    return out


def run_floor(base_url: str, task, batches: list[list[ChatRequest]], run_dir: Path,
              server_pid: int | None = None) -> Timed:
    """The same requests with only the work the protected path cannot drop: each output scored as
    it arrives (the task's own ``score_text``) and its verdict appended to a real ledger's batch as
    soon as every one before it is in (as a session does: :class:`InOrder`), each batch one write,
    fsync and head before the next batch is sent."""
    examples = scored_examples(task, batches)
    with ModelClient("test-model", base_url, concurrency=CONCURRENCY) as client, CoreMeter(server_pid) as meter:
        wall, cpu = time.perf_counter(), time.process_time()
        ledger = Ledger.open(run_dir)
        cid, calls = candidate_id({"instruction": "floor"}), 0
        for batch, exs in zip(batches, examples):
            calls += len(batch)

            def record(k, verdict, exs=exs, calls=calls):
                ledger.append_entry("evaluation", {"candidate_id": cid, "split": "train", "example_id": exs[k].id,
                                                   "cached": False, "metric_calls": calls, "verdict": verdict.to_dict(),
                                                   "cost": 1})
            in_order = InOrder(len(batch), record)
            with ledger.batch():
                for i, answer in client.complete_each(batch):
                    in_order.scored(i, task.benchmark.score_text(answer.text, exs[i]))
        ledger.close()
        timed = Timed(time.perf_counter() - wall, time.process_time() - cpu, sum(map(len, batches)))
    timed.cores = meter.cores
    return timed


def measure(latency: float, data_dir: str | None, profile_to: str | None = None) -> dict:
    """Session, bare, session, bare at ``latency``; the means and each run."""
    task = load_task(TASK, PROFILE, data_dir)
    proc, base_url = start_cot_server(latency)
    root = Path(tempfile.mkdtemp(prefix="heldout-perf-protected-"))
    profiler = cProfile.Profile() if profile_to else None
    try:
        sessions, bares, floors = [], [], []
        for k in range(2):
            timed, batches = run_session(base_url, task, root / f"session-{k}", profiler if k == 1 else None, proc.pid)
            sessions.append(timed)
            bares.append(run_bare(base_url, batches, proc.pid))
            floors.append(run_floor(base_url, task, batches, root / f"floor-{k}", proc.pid))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
    if profiler is not None:
        profiler.dump_stats(profile_to)
    mean = lambda runs, field: sum(getattr(r, field) for r in runs) / len(runs)  # noqa: E731
    return {"latency": latency, "requests": sessions[0].requests,
            "session_wall": mean(sessions, "wall"), "bare_wall": mean(bares, "wall"),
            "session_cpu": mean(sessions, "cpu"), "bare_cpu": mean(bares, "cpu"),
            "floor_wall": mean(floors, "wall"), "floor_cpu": mean(floors, "cpu"),
            "ledger_bytes": sessions[0].ledger_bytes, "ledger_entries": sessions[0].ledger_entries,
            "cores": {who: mean_cores([r.cores for r in runs]) for who, runs in
                      (("bare", bares), ("session", sessions), ("floor", floors))},
            "runs": {"session": sessions, "bare": bares, "floor": floors}}


def rows_of(m: dict) -> list[dict]:
    """Rows for perf/run_all.py: the session's wall against the bare client's (target per latency)."""
    n, latency = m["requests"], m["latency"]
    target = TARGETS.get(latency, 1.10)
    ratio = m["session_wall"] / m["bare_wall"]
    walls = lambda who: ", ".join(f"{r.wall:.2f}" for r in m["runs"][who])  # noqa: E731
    return [{"name": f"protected path: {n} requests, {latency * 1000:g} ms latency, concurrency {CONCURRENCY}",
             "value": m["session_wall"], "unit": "s", "ratio": ratio,
             "target": f"<= {target:.2f}x bare ModelClient (same run)", "passed": ratio <= target,
             "note": f"session {walls('session')} s, bare {walls('bare')} s; CPU per metric call "
                     f"{1000 * m['session_cpu'] / n:.2f} ms against {1000 * m['bare_cpu'] / n:.2f} ms bare; "
                     f"floor (bare + each output scored and appended as it arrives, a ledger batch per batch) "
                     f"{m['floor_wall'] / m['bare_wall']:.2f}x bare, {1000 * m['floor_cpu'] / n:.2f} ms CPU per call; "
                     f"ledger {m['ledger_bytes'] / m['ledger_entries']:.0f} B/entry; {cores_note(m)}"}]


def cpu_bound_ratios(m: dict) -> dict[str, float]:
    """At 0 ms latency, where the bare run's wall is CPU: the least wall the session's and the
    floor's CPU allow (each process on at most one core, all on every core of the machine, nothing
    else running: perf/cores.py, cpu_bound_seconds) over the bare run's. Empty at other latencies."""
    if m["latency"] != 0:
        return {}
    ncpu = os.cpu_count() or 1
    bare = cpu_bound_seconds(*m["cores"]["bare"].cpu_seconds(), ncpu=ncpu)
    return {who: cpu_bound_seconds(*m["cores"][who].cpu_seconds(), ncpu=ncpu) / bare for who in ("session", "floor")}


def cores_note(m: dict) -> str:
    """The row's short account of the cores: how many the bare run kept busy, and the ratio the
    session's CPU alone allows (the ceiling no second process gets under without less CPU)."""
    bare = m["cores"]["bare"]
    note = f"the bare run kept {bare.ours:.2f} of {os.cpu_count()} cores busy (client + server)"
    if bare.others is not None:
        note += f", other work {bare.others:.2f}"
    bounds = cpu_bound_ratios(m)
    if bounds:
        note += f"; the session's CPU alone allows {bounds['session']:.2f}x, the floor's {bounds['floor']:.2f}x"
    return note


def cores_line(m: dict) -> str:
    """Cores busy over each kind of run (the mean of its runs) and, at 0 ms, the ratios their CPU
    alone allows (:func:`cpu_bound_ratios`). Work moved off the client's core needs a core the bare
    run leaves idle."""
    line = f"  cores busy at {m['latency'] * 1000:g} ms (of {os.cpu_count()}): " + "; ".join(
        f"{who} {m['cores'][who].describe()}" for who in ("bare", "session", "floor"))
    bounds = cpu_bound_ratios(m)
    if bounds:
        line += ("; at the least wall its CPU allows (one core per process, an idle machine) each run takes "
                 + ", ".join(f"{who} {ratio:.2f}x" for who, ratio in bounds.items()) + " the bare run's")
    return line


def work_per_output(data_dir: str | None) -> dict[str, float]:
    """CPU seconds per output of scoring it and of appending its evaluation entry (see the module
    docstring), on the outputs a session against the chain-of-thought server at 0 ms recorded."""
    task = load_task(TASK, PROFILE, data_dir)
    proc, base_url = start_cot_server(0.0)
    root = Path(tempfile.mkdtemp(prefix="heldout-perf-protected-"))
    try:
        run_session(base_url, task, root / "session")
        proc.terminate()
        recorded = [e["data"] for e in Ledger.open(root / "session").entries("evaluation")]
        examples = {ex.id: ex for ex in task.splits["train"]}
        outputs = [(examples[d["example_id"]], d["verdict"]["output"]["text"]) for d in recorded]

        def run(append: bool, k: int) -> float:
            ledger = Ledger.open(root / f"work-{append}-{k}")
            cpu = time.process_time()
            for start in range(0, len(outputs), BATCH):
                verdicts = [(ex.id, task.benchmark.score_text(text, ex)) for ex, text in outputs[start:start + BATCH]]
                if append:
                    with ledger.batch():
                        for i, (example_id, v) in enumerate(verdicts):
                            ledger.append_entry("evaluation", {"candidate_id": "c" * 64, "split": "train", "cached": False,
                                                               "example_id": example_id, "metric_calls": start + i,
                                                               "verdict": v.to_dict(), "cost": 1})
            cpu = time.process_time() - cpu
            ledger.close()
            return cpu / len(outputs)
        run(True, -1)  # warm: lazy imports, compiled patterns
        scoring = min(run(False, k) for k in range(5))
        both = min(run(True, k) for k in range(5))
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
    return {"outputs": len(outputs), "scoring": scoring, "ledger": both - scoring}


def figures(data_dir: str | None = None, latencies=(0.0, 0.05)) -> list[dict]:
    return [row for latency in latencies for row in rows_of(measure(latency, data_dir))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("HELDOUT_DATA_DIR", str(HERE.parent.parent / "shared" / "data")))
    parser.add_argument("--latency", type=float, action="append", help="seconds (repeatable; default 0 and 0.05)")
    parser.add_argument("--profile", help="write a cProfile of the second session run here")
    parser.add_argument("--work", action="store_true", help="only the floor's own work per output (no ratio)")
    args = parser.parse_args(argv)
    if args.work:
        w = work_per_output(args.data_dir)
        print(f"per output ({w['outputs']} chain-of-thought outputs, CPU, best of 5): scoring "
              f"{1e6 * w['scoring']:.0f} us, ledger append {1e6 * w['ledger']:.0f} us; "
              f"load average {os.getloadavg()[0]:.2f}")
        return 0
    ok = True
    for latency in args.latency or [0.0, 0.05]:
        m = measure(latency, args.data_dir, args.profile)
        for row in rows_of(m):
            ok = ok and row["passed"]
            print(f"{row['name']}: {row['value']:.2f} s, {row['ratio']:.2f}x ({row['target']}): "
                  f"{verdict(row['passed'])}; {row['note']}")
        print(cores_line(m))
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
