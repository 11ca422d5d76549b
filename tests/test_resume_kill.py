"""`kill -9` of the harness mid-run, then resume: the ledger verifies, nothing recorded is lost,
nothing is counted twice, and the finished run equals an uninterrupted one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from heldout.evaluators.ledger import HEAD_FILE, LEDGER_FILE, Ledger, verify_ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.sandbox import isolation_mode

# A deterministic in-process optimizer: (1+1) search over digit literals of the seed SQL, in
# minibatches of 5, pausing between steps so the test can kill it mid-run.
HARNESS = """
import json, random, re, sys, time
import heldout
from heldout.evaluators.session import Budget, Session

run_dir, pause = sys.argv[1], float(sys.argv[2])
DIGIT = re.compile(r"'(\\d)'")

def optimizer(view, seed):
    rng = random.Random(seed)
    ids = [ex["id"] for ex in view.train]
    best = view.seed_candidate
    while view.remaining >= 10:
        batch = rng.sample(ids, 5)
        text = best["scorer.sql"]
        hit = rng.choice(list(DIGIT.finditer(text)))
        child = {"scorer.sql": text[:hit.start(1)] + str(rng.randrange(10)) + text[hit.end(1):]}
        old = sum(r["score"] for r in view.evaluate(best, "train", batch))
        new = sum(r["score"] for r in view.evaluate(child, "train", batch))
        if new >= old:
            best = child
        time.sleep(pause)
        while pause and view.remaining <= 60:  # the killed run waits for its kill past half the budget,
            time.sleep(1)                      # so a slow test process cannot miss the run it kills
    return best

task = heldout.load_task("lockpicking/six", profile="paper")
session = Session(task, budget=Budget(120), seed=7, run_dir=run_dir, method="kill-test")
record = session.run(optimizer)
print(json.dumps({"status": record.status, "resumed": session.resumed}))
"""


REPO = Path(__file__).resolve().parents[1]
# the harness scripts live outside the repo: make sure they import this checkout's heldout
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def evaluations(run_dir: Path) -> list[dict]:
    return [e["data"] for e in Ledger.open(run_dir).entries("evaluation")] if (run_dir / LEDGER_FILE).exists() else []


def count_lines(path: Path, kind: str) -> int:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return 0
    return text.count(f'"kind": "{kind}"')


def start(script: Path, run_dir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script), str(run_dir), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=ENV)


def kill_after(proc: subprocess.Popen, ledger: Path, kind: str, n: int, limit: float = 120.0) -> int:
    """SIGKILL ``proc`` once ``n`` entries of ``kind`` are in the ledger; returns how many of them
    were acknowledged: named by the head. A batch the kill caught written but not yet named was
    never returned to the optimizer, and a resume drops it (the ledger's rule), so it is not
    something a resume may reuse."""
    give_up = time.monotonic() + limit
    while count_lines(ledger, kind) < n:
        assert proc.poll() is None, f"harness ended before it could be killed: {proc.communicate()}"
        assert time.monotonic() < give_up, "harness made no progress"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    named = json.loads((ledger.parent / HEAD_FILE).read_text())["count"]
    return sum(json.loads(line)["kind"] == kind for line in ledger.read_text().splitlines()[:named])


def scored(verdicts: list[dict]) -> list[dict]:
    return [{k: v for k, v in verdict.items() if k != "usage"} for verdict in verdicts]  # usage holds timings


def comparable(record: RunRecord) -> dict:
    return {"final": record.final_candidate, "test": scored(record.test_verdicts), "val": scored(record.val_verdicts),
            "test_score": record.test_score, "metric_calls": record.usage["metric_calls"],
            "candidates": sorted(c["candidate_id"] for c in record.lineage)}


def history(record: RunRecord) -> dict:
    """When, by metric calls, each candidate first appeared and the best-so-far improved."""
    return {"trajectory": record.trajectory,
            "lineage": sorted(record.lineage, key=lambda c: (c["first_metric_call"], c["candidate_id"]))}


def evaluation_keys(run_dir: Path) -> list[tuple]:
    return [(d["candidate_id"], d["split"], d["example_id"], d["metric_calls"], d["verdict"]["score"])
            for d in evaluations(run_dir)]


@pytest.fixture(scope="module")
def clean_and_killed(tmp_path_factory):
    """The same deterministic session run twice: once straight through, once SIGKILLed after 30
    evaluations and then re-run on the same run dir."""
    tmp_path = tmp_path_factory.mktemp("kill")
    script = tmp_path / "harness.py"
    script.write_text(textwrap.dedent(HARNESS))
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    done = subprocess.run([sys.executable, str(script), str(clean), "0"], capture_output=True, text=True, env=ENV)
    assert done.returncode == 0, done.stderr
    proc = start(script, killed, "0.05")
    at_kill = kill_after(proc, killed / LEDGER_FILE, "evaluation", 30)
    assert proc.returncode == -signal.SIGKILL and not (killed / RECORD_FILE).exists()
    again = subprocess.run([sys.executable, str(script), str(killed), "0"], capture_output=True, text=True, env=ENV)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.splitlines()[-1]) == {"status": "ok", "resumed": True}
    return clean, killed, at_kill


def test_kill_minus_nine_then_resume_equals_an_uninterrupted_run(clean_and_killed):
    clean, killed, at_kill = clean_and_killed
    reference, resumed = RunRecord.load(clean), RunRecord.load(killed)
    assert reference.status == "ok" and 0 < at_kill < reference.usage["metric_calls"]
    assert verify_ledger(killed).ok
    # nothing lost: every evaluation recorded before the kill was reused, not re-run
    assert resumed.usage["replayed"] == at_kill
    # nothing double counted: the same evaluations, in the same order, at the same budget counts
    assert evaluation_keys(killed) == evaluation_keys(clean)
    assert comparable(resumed) == comparable(reference)
    kinds = Counter(e["kind"] for e in Ledger.open(killed).entries())
    assert kinds["session_start"] == 1 and kinds["session_resumed"] == 1 and kinds["session_end"] == 1
    assert kinds["test_scoring"] == len(reference.test_verdicts)


def test_resumed_trajectory_and_lineage_keep_their_original_metric_call_counts(clean_and_killed):
    clean, killed, _ = clean_and_killed
    assert history(RunRecord.load(killed)) == history(RunRecord.load(clean))


ISOLATED_HARNESS = """
import json, sys
import heldout
from heldout.evaluators.isolated import run_isolated
from heldout.evaluators.session import Budget, Session

run_dir, optimizer = sys.argv[1], sys.argv[2:]
task = heldout.load_task("lockpicking/six", profile="paper")
session = Session(task, budget=Budget(80, wall_seconds=600), seed=5, run_dir=run_dir, method="kill-isolated")
record = run_isolated(session, optimizer)
print(json.dumps({"status": record.status, "error": record.error, "resumed": session.resumed}))
"""

# deterministic given the same answers, so a restarted optimizer replays its requests
SLOW_OPTIMIZER = """
import os, random, sys, time
from heldout.adapters.client import TaskClient

client = TaskClient.from_env()
rng = random.Random(int(os.environ["HELDOUT_SEED"]))
ids = [ex["id"] for ex in client.train]
pause = float(sys.argv[1])
candidates = [{"scorer.sql": "CAST(LENGTH(PROGRAM) + %d AS VARCHAR)" % k} for k in range(16)]
best, best_score = None, -1.0
for cand in candidates:
    score = sum(r["score"] for r in client.evaluate(cand, "train", rng.sample(ids, 5)))
    if score > best_score:
        best, best_score = cand, score
        client.submit_final(best)
    time.sleep(pause)
"""


@pytest.mark.skipif(isolation_mode() == "none", reason="no namespaces here (CI runs as root: 'root' mode)")
def test_kill_minus_nine_of_an_isolated_session_kills_the_optimizer_and_resumes(tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="heldout-test-kill-"))
    folder.chmod(0o755)  # the optimizer's throw-away uid must read its script
    try:
        harness = folder / "harness.py"
        harness.write_text(textwrap.dedent(ISOLATED_HARNESS))
        optimizer = folder / "slow_optimizer.py"
        optimizer.write_text(textwrap.dedent(SLOW_OPTIMIZER))
        optimizer.chmod(0o644)
        clean, killed = tmp_path / "clean", tmp_path / "killed"
        done = subprocess.run([sys.executable, str(harness), str(clean), sys.executable, str(optimizer), "0"],
                              capture_output=True, text=True, env=ENV)
        assert done.returncode == 0 and json.loads(done.stdout.splitlines()[-1])["status"] == "ok", done

        tag = f"0.3{int.from_bytes(os.urandom(3), 'big')}"  # the pause, as a marker in the command line
        proc = start(harness, killed, sys.executable, str(optimizer), tag)
        at_kill = kill_after(proc, killed / LEDGER_FILE, "evaluation", 20)
        deadline = time.monotonic() + 30
        while any(tag in cmd for cmd in _command_lines()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(tag in cmd for cmd in _command_lines()), "the optimizer outlived its harness"

        again = subprocess.run([sys.executable, str(harness), str(killed), sys.executable, str(optimizer), "0"],
                               capture_output=True, text=True, env=ENV)
        outcome = json.loads(again.stdout.splitlines()[-1])
        assert outcome["status"] == "ok" and outcome["resumed"], (outcome, again.stderr)
        assert verify_ledger(killed).ok
        resumed, reference = RunRecord.load(killed), RunRecord.load(clean)
        assert 0 < at_kill < reference.usage["metric_calls"]
        assert resumed.usage["replayed"] == at_kill
        assert evaluation_keys(killed) == evaluation_keys(clean)
        assert comparable(resumed) == comparable(reference)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _command_lines() -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        try:
            out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return out
