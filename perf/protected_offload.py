"""Prototype (issue 60, measurement only): the protected path's own work in a second process.

At 0 ms latency the bare client's wall is its own CPU and the loopback server's, so the work the
protected path cannot drop (score each output, append its evaluation entry to a hash-chained
ledger, one write, fsync and head per batch: the *floor* of perf/protected_path.py) adds to the
wall in one process. Here that work runs in a helper process fed through a pipe, and the client
waits for the helper's "durable" (the batch's entries written, synced and named by the head)
before it sends the next batch, as a session must return nothing before its entry is durable.
The helper does the same work as the floor, with heldout's own calls (the task's ``score_text``,
:meth:`Ledger.append` inside :meth:`Ledger.batch`), on the outputs the client got.

Two ways to feed it, each against the bare client and the in-process floor in the same run:

* ``batch``: one message per batch once the batch is whole (``complete_many``); the helper's
  work is then on the critical path, after the last answer, as in one process;
* ``stream``: one message per output as it arrives (``complete_each``), a last one when the batch
  is whole; the helper scores and encodes while the rest of the batch is in flight, and only the
  last outputs, the write, the fsync and the head follow the last answer;
* ``engine``: as ``stream``, but each output is sent by the client's event loop as it arrives
  (a ModelClient subclass), so the caller's thread is not woken once per answer.

    python perf/protected_offload.py [--latency 0] [--rounds 3] [--data-dir ../shared/data]
    python perf/protected_offload.py --kill 20   # kill -9 the helper anywhere: each ledger verifies

Beside each kind's wall: its client's, server's and helper's CPU per call, the cores each kept busy
(perf/cores.py; ``others`` is the rest of the machine's work) and, at 0 ms, the ratio of the least
walls the runs' CPU allows (each process on at most one core, all on the machine's cores, nothing
else running; waits such as the batch's fsync not counted): how far any design moving this work to
a second process could go on this machine.

Each round runs bare, floor, batch, stream, engine in that order (so a change of load hits all); every
figure is the mean over rounds. The helper's start (an interpreter, heldout's imports, the task)
is made before the timed runs and printed apart: a product would start it with the session.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's heldout and the sibling scripts

from heldout import load_task  # noqa: E402
from heldout.contracts import candidate_id  # noqa: E402
from heldout.evaluators.ledger import Ledger, verify_ledger  # noqa: E402
from heldout.models import ChatRequest, ModelClient  # noqa: E402

from cores import CoreMeter, cpu_bound_seconds, mean_cores, process_cpu_seconds  # noqa: E402
from protected_path import (CONCURRENCY, PROFILE, TASK, Timed, run_bare, run_floor, run_session,  # noqa: E402
                            scored_examples, start_cot_server)

KINDS = ("bare", "floor", "batch", "stream", "engine")
OFFLOADED = KINDS[2:]
PIPE_BYTES = 1 << 20  # F_SETPIPE_SZ: the client's writes never wait for a helper a batch behind
F_SETPIPE_SZ = 1031


# -- the helper process -----------------------------------------------------------------------------
def serve_helper(run_dir: Path, data_dir: str | None) -> int:
    """The helper: reads messages on stdin, answers on stdout (pickles; the peer is this script)."""
    inbox, outbox = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the answers
    task = load_task(TASK, PROFILE, data_dir)
    examples = {ex.id: ex for split in task.splits.values() for ex in split}
    ledger = Ledger.open(run_dir)
    say = lambda obj: (pickle.dump(obj, outbox, protocol=pickle.HIGHEST_PROTOCOL), outbox.flush())  # noqa: E731
    say(("ready", os.getpid()))
    batch, scores = contextlib.ExitStack(), []

    def record(example_id: str, text: str, cid: str, calls: int) -> None:
        verdict = task.benchmark.score_text(text, examples[example_id])
        ledger.append_entry("evaluation", {"candidate_id": cid, "split": "train", "example_id": example_id, "cached": False,
                                           "metric_calls": calls, "verdict": verdict.to_dict(), "cost": 1})
        scores.append(verdict.score)

    while True:
        try:
            message = pickle.load(inbox)
        except EOFError:
            break
        kind = message[0]
        if kind == "batch":  # ("batch", cid, calls, [(example_id, text), ...])
            _, cid, calls, outputs = message
            batch.enter_context(ledger.batch())
            for example_id, text in outputs:
                record(example_id, text, cid, calls)
        elif kind == "one":  # ("one", cid, calls, example_id, text): the batch stays open
            if not scores:
                batch.enter_context(ledger.batch())
            record(message[3], message[4], message[1], message[2])
            continue
        flushed = time.perf_counter()
        batch.close()  # the batch's end: one write, fsync and head
        say(("durable", scores, time.perf_counter() - flushed))
        scores = []
    ledger.close()
    return 0


class Helper:
    """The helper process, started and ready (its start timed apart)."""

    def __init__(self, run_dir: Path, data_dir: str | None) -> None:
        wall = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, __file__, "--helper", str(run_dir), "--data-dir", str(data_dir)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.inbox, self.outbox = self.proc.stdout, self.proc.stdin
        for pipe in (self.inbox, self.outbox):
            with contextlib.suppress(OSError):
                fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
        ready = self.receive()
        if ready[0] != "ready":
            raise SystemExit(f"the helper did not start: {ready!r}")
        self.start_wall = time.perf_counter() - wall
        self.start_cpu = process_cpu_seconds(self.proc.pid)

    def send(self, message: tuple, flush: bool = True) -> None:
        pickle.dump(message, self.outbox, protocol=pickle.HIGHEST_PROTOCOL)
        if flush:
            self.outbox.flush()

    def receive(self) -> tuple:
        return pickle.load(self.inbox)

    def cpu(self) -> float | None:
        return process_cpu_seconds(self.proc.pid)

    def close(self) -> None:
        self.outbox.close()
        if self.proc.wait(timeout=30) != 0:
            raise SystemExit(f"the helper failed: exit {self.proc.returncode}")


class ForwardingClient(ModelClient):
    """A ModelClient whose event loop hands each answer to ``forward`` as it arrives (on the
    client's own thread: no wake-up of the caller's thread per answer, unlike ``complete_each``)."""

    def __init__(self, *args, forward, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.forward = forward

    async def _acomplete(self, request, engine):
        answer = await super()._acomplete(request, engine)
        if self.forward is not None:
            self.forward(request, answer)
        return answer


def run_offload(base_url: str, batches: list[list[ChatRequest]], examples: list[list], helper: Helper,
                kind: str, server_pid: int) -> Timed:
    """The bare client's requests, batch by batch, each batch's work done by ``helper``, fed as
    ``kind`` says (the module docstring); the next batch is sent only once the helper says the
    last is durable."""
    cid, calls, scores = candidate_id({"instruction": "offload"}), 0, 0
    waited = flushing = 0.0  # from the batch's last answer to "durable"; the helper's write, fsync and head
    example_of: dict[int, str] = {}  # id(request) -> its example's id, for the engine's forwarding
    forward = lambda request, answer: helper.send(("one", cid, calls, example_of[id(request)], answer.text))  # noqa: E731
    with ForwardingClient("test-model", base_url, concurrency=CONCURRENCY,
                          forward=forward if kind == "engine" else None) as client:
        helper_cpu = helper.cpu()
        with CoreMeter(server_pid) as meter:
            wall, cpu = time.perf_counter(), time.process_time()
            for batch, exs in zip(batches, examples):
                calls += len(batch)
                if kind == "stream":
                    for i, answer in client.complete_each(batch):
                        helper.send(("one", cid, calls, exs[i].id, answer.text))
                    helper.send(("end",))
                elif kind == "engine":
                    example_of = {id(request): ex.id for request, ex in zip(batch, exs)}
                    client.complete_many(batch)
                    helper.send(("end",))
                else:
                    answers = client.complete_many(batch)
                    helper.send(("batch", cid, calls, [(ex.id, a.text) for ex, a in zip(exs, answers)]))
                asked = time.perf_counter()
                reply = helper.receive()
                waited, flushing = waited + time.perf_counter() - asked, flushing + reply[2]
                if reply[0] != "durable" or len(reply[1]) != len(batch):
                    raise SystemExit(f"the helper answered {reply[0]!r} with {len(reply[1])} scores for {len(batch)}")
                scores += len(reply[1])
            timed = Timed(time.perf_counter() - wall, time.process_time() - cpu, scores)
        timed.cores = meter.cores
        timed.helper_cpu = helper.cpu() - helper_cpu
        timed.waited, timed.flushing = waited, flushing
    return timed


def measure(latency: float, rounds: int, data_dir: str | None) -> dict:
    task = load_task(TASK, PROFILE, data_dir)
    server, base_url = start_cot_server(latency)
    root = Path(tempfile.mkdtemp(prefix="heldout-perf-offload-"))
    runs: dict[str, list[Timed]] = {k: [] for k in KINDS}
    try:
        _, batches = run_session(base_url, task, root / "session")  # the session's own requests
        examples = scored_examples(task, batches)
        helpers = {k: Helper(root / k, data_dir) for k in OFFLOADED}
        for r in range(rounds):
            runs["bare"].append(run_bare(base_url, batches, server.pid))
            runs["floor"].append(run_floor(base_url, task, batches, root / f"floor-{r}", server.pid))
            for kind, helper in helpers.items():
                runs[kind].append(run_offload(base_url, batches, examples, helper, kind, server.pid))
        for helper in helpers.values():
            helper.close()
        for kind in helpers:  # the helper's ledger holds every output of every round, verifiably
            report = verify_ledger(root / kind)
            want = rounds * sum(map(len, batches))
            if not report.ok or report.entries != want:
                raise SystemExit(f"the {kind} helper's ledger: {report.describe()} ({want} entries expected)")
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
    return {"latency": latency, "requests": sum(map(len, batches)), "runs": runs, "helpers": helpers}


def report(m: dict) -> list[str]:
    runs, n, ncpu = m["runs"], m["requests"], os.cpu_count() or 1
    mean = lambda kind, f: sum(getattr(t, f) for t in runs[kind]) / len(runs[kind])  # noqa: E731
    bare = mean("bare", "wall")
    lines = [f"{n} requests at {m['latency'] * 1000:g} ms latency, concurrency {CONCURRENCY}, "
             f"{len(runs['bare'])} rounds (means; of {ncpu} cores):"]
    bare_bound = cpu_bound_seconds(*mean_cores([t.cores for t in runs["bare"]]).cpu_seconds(), ncpu=ncpu)
    for kind in KINDS:
        cores = mean_cores([t.cores for t in runs[kind]])
        helper, cpu = "", cores.cpu_seconds()
        if kind in m["helpers"]:
            h = sum(t.helper_cpu for t in runs[kind]) / len(runs[kind])
            helper, cpu = (f", helper {1000 * h / n:.2f} ms CPU per call ({h / cores.wall:.2f} cores); waited for "
                           f"\"durable\" {mean(kind, 'waited'):.3f} s a run, of which write, fsync and head "
                           f"{mean(kind, 'flushing'):.3f} s"), cpu + (h,)
        walls = ", ".join(f"{t.wall:.2f}" for t in runs[kind])
        bound = "" if m["latency"] else f" (at the least wall its CPU allows: {cpu_bound_seconds(*cpu, ncpu=ncpu) / bare_bound:.2f}x)"
        server = "" if cores.server is None else f", server {1000 * cores.server * cores.wall / n:.2f} ms"
        lines.append(f"  {kind:6s} {mean(kind, 'wall'):.3f} s ({walls}), {mean(kind, 'wall') / bare:.2f}x bare{bound}; client "
                     f"{1000 * mean(kind, 'cpu') / n:.2f} ms CPU per call{server}{helper}; cores busy: {cores.describe()}")
    for kind, h in m["helpers"].items():
        lines.append(f"  {kind} helper's start: {h.start_wall:.2f} s wall, {h.start_cpu:.2f} s CPU (before the runs)")
    return lines


def kill_check(data_dir: str | None, trials: int, seed: int = 0) -> list[str]:
    """Kill -9 the streaming helper at a random point of a random batch, ``trials`` times: while
    its outputs come in, or (half the trials) within 30 ms of the batch's end, while the helper
    writes, syncs and names them. The ledger left behind must open (a torn or unclaimed tail cut
    off), verify, and hold every entry of every batch the helper had said was durable, in order,
    and nothing of the last batch unless all of it (its head was written)."""
    task = load_task(TASK, PROFILE, data_dir)
    rng, lines = random.Random(seed), []
    server, base_url = start_cot_server(0.0)
    root = Path(tempfile.mkdtemp(prefix="heldout-perf-offload-kill-"))
    try:
        _, batches = run_session(base_url, task, root / "session")
        examples = scored_examples(task, batches)
        cid = candidate_id({"instruction": "offload"})
        with ModelClient("test-model", base_url, concurrency=CONCURRENCY) as client:
            for t in range(trials):
                helper = Helper(root / f"kill-{t}", data_dir)
                last = rng.randrange(1, len(batches))  # the batch during which the helper dies
                acknowledged, calls = [], 0
                for k, (batch, exs) in enumerate(zip(batches[:last + 1], examples)):
                    calls += len(batch)
                    sent, kill_at = [], None
                    if k == last:
                        kill_at = len(batch) if rng.random() < 0.5 else rng.randrange(len(batch))
                    for i, answer in client.complete_each(batch):
                        if len(sent) == kill_at:
                            break
                        helper.send(("one", cid, calls, exs[i].id, answer.text))
                        sent.append(exs[i].id)
                    if kill_at is None or kill_at == len(batch):  # the batch is whole: its end is sent
                        helper.send(("end",))
                    if k == last:
                        time.sleep(rng.random() * (0.03 if kill_at == len(batch) else 0.01))  # anywhere in its work
                        helper.proc.kill()
                        helper.proc.wait()
                        break
                    if helper.receive()[0] != "durable":
                        raise SystemExit("the helper did not say durable")
                    acknowledged.extend(sent)
                Ledger.open(root / f"kill-{t}").close()  # a writer's open: cuts a torn or unclaimed tail
                report = verify_ledger(root / f"kill-{t}")
                kept = [e["data"]["example_id"] for e in report.checked if e["kind"] == "evaluation"]
                if not report.ok or kept not in (acknowledged, acknowledged + sent):
                    raise SystemExit(f"kill -9 in batch {last}: {report.describe()}; {len(kept)} entries kept, "
                                     f"{len(acknowledged)} acknowledged")
                when = "after its end was sent" if kill_at == len(batch) else f"after {kill_at} of its outputs"
                repairs = sorted({e["kind"] for e in report.checked if e["kind"] != "evaluation"})
                lines.append(f"  killed in batch {last} {when}: {len(acknowledged)} acknowledged, {len(kept)} evaluations "
                             f"kept{', ' + ', '.join(repairs) if repairs else ''}; the ledger verifies")
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("HELDOUT_DATA_DIR", str(HERE.parent.parent / "shared" / "data")))
    parser.add_argument("--latency", type=float, action="append", help="seconds (repeatable; default 0)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kill", type=int, metavar="N", help="instead: kill -9 the helper N times, check each ledger")
    parser.add_argument("--helper", help=argparse.SUPPRESS)  # the helper process's own run dir
    args = parser.parse_args(argv)
    if args.helper:
        return serve_helper(Path(args.helper), args.data_dir)
    if args.kill:
        print("\n".join(kill_check(args.data_dir, args.kill)))
        return 0
    for latency in args.latency or [0.0]:
        print("\n".join(report(measure(latency, args.rounds, args.data_dir))))
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
