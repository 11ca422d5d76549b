"""Faithful resume: a study killed with SIGKILL and resumed with ``heldout run --resume`` ends with
byte-identical final candidates and held-out scores as an uninterrupted study, on a program task
and on a prompt task (worker and architect on a loopback test server).

Both optimizers plan with ``view.remaining`` at their start (local-search splits its restarts by
it; the prompt planner fixes its number of rounds by it), so a resume that showed the budget left
*after* the interruption, instead of the budget as it was at that point of the original run,
would search differently (the issue saw 0.0047557 after resume vs 0.0048038 uninterrupted)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from heldout.evaluators.ledger import LEDGER_FILE, verify_ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.models.testserver import TestServer
from paced_studies import PACED_SEARCH, env, kill_after, start_cli

PROMPT_PLANNER = """
import os, random, time

def optimize(view, seed):
    rng = random.Random(seed)
    ids = [ex["id"] for ex in view.train]
    batch = 4
    rounds = view.remaining // (2 * batch)  # the plan depends on the budget seen at the start
    best = dict(view.seed_candidate)
    for r in range(rounds):
        sample = rng.sample(ids, batch)
        here = sum(x["score"] for x in view.evaluate(best, "train", sample))
        reply = view.architect([{"role": "user", "content": f"Round {r} of {rounds}. Improve: {best['instruction']}"}],
                               temperature=0.0)
        child = {**best, "instruction": reply.strip()[:400] or best["instruction"]}
        there = sum(x["score"] for x in view.evaluate(child, "train", sample))
        if there >= here:
            best = child
        time.sleep(float(os.environ.get("PACE", "0")))
    return best
"""


def kill_study_midway(args: list[str], cwd: Path, run_dir: Path, after: int) -> None:
    kill_after(start_cli([*args, "--run-dir", str(run_dir)], cwd, pace=0.3), run_dir, after)
    assert not list(run_dir.rglob(RECORD_FILE))


def run(args: list[str], cwd: Path, run_dir: Path, *extra: str) -> None:
    done = subprocess.run([sys.executable, "-m", "heldout.cli", *args, "--run-dir", str(run_dir), *extra], cwd=cwd,
                          env=env(0.0), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def outcome(run_dir: Path) -> list[dict]:
    out = []
    for path in sorted(run_dir.rglob(RECORD_FILE)):
        record = RunRecord.load(path.parent)
        out.append({"cell": str(path.parent.relative_to(run_dir)),
                    "final": json.dumps(record.final_candidate, sort_keys=True),
                    "test": [(v["example_id"], v["score"], v["output"]) for v in record.test_verdicts],
                    "test_score": record.test_score, "metric_calls": record.usage["metric_calls"],
                    "trajectory": record.trajectory})
    return out


def check_faithful(tmp_path: Path, args: list[str], after: int) -> None:
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    run(args, tmp_path, clean)
    kill_study_midway(args, tmp_path, killed, after)
    run(args, tmp_path, killed, "--resume")
    assert all(verify_ledger(p.parent).ok for p in killed.rglob(LEDGER_FILE))
    resumed, reference = outcome(killed), outcome(clean)
    assert [r["cell"] for r in resumed] == [r["cell"] for r in reference] and resumed
    assert resumed == reference
    replayed = [RunRecord.load(p.parent).usage["replayed"] for p in killed.rglob(RECORD_FILE)]
    assert max(replayed) > 0  # the killed cell really resumed from its ledger


def test_kill_minus_nine_and_resume_of_a_program_study_is_byte_identical(tmp_path):
    (tmp_path / "paced.py").write_text(textwrap.dedent(PACED_SEARCH))
    args = ["run", "--task", "circle_packing/square26", "--optimizer", "search=paced:optimize",
            "--seeds", "4", "--budget", "24"]
    check_faithful(tmp_path, args, after=8)


@pytest.fixture(scope="module")
def server():
    with TestServer(latency=0.0, seed=0) as srv:
        yield srv


def test_kill_minus_nine_and_resume_of_a_prompt_study_is_byte_identical(tmp_path, server, data_dir):
    (tmp_path / "planner.py").write_text(textwrap.dedent(PROMPT_PLANNER))
    args = ["run", "--task", "bbh/word_sorting", "--profile", "sepo", "--optimizer", "planner=planner:optimize",
            "--seeds", "1", "--budget", "40", "--worker-model", "test-worker", "--architect-model", "test-architect",
            "--base-url", server.base_url, "--data-dir", str(data_dir)]
    check_faithful(tmp_path, args, after=12)
