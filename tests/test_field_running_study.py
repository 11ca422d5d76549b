"""Field conditions: a study read while it runs.

In the lab a report is made of a finished study. In the field a person reports on a study that
is still running (to see how it goes), from another terminal. A run without a record then read
"the session was interrupted before it finished; resume it", and a ``--resume`` on a running
study only meets "in use"; a leak ablation of it went ahead on the runs finished so far. A run
whose ledger its session holds is running, and the report says so, the ablation refuses; once its
process is gone it reads as interrupted again."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from heldout.protocols.folders import LEAK_ABLATION_DIR

SLOW = """
import time

def optimize(view, seed):
    ids = [ex["id"] for ex in view.train][:2]
    while view.remaining >= len(ids):
        view.evaluate({"scorer.sql": "CAST(LENGTH(PROGRAM) + %d AS VARCHAR)" % view.remaining}, "train", ids)
        time.sleep(0.2)
    return dict(view.seed_candidate)
"""


def report_warnings(study: Path, out: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "heldout", "report", str(study), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-1500:]
    return done.stderr


def test_a_report_of_a_running_study_says_its_sessions_run_and_after_a_stop_that_they_were_interrupted(tmp_path):
    (tmp_path / "slow_opt.py").write_text(textwrap.dedent(SLOW))
    study = tmp_path / "study"
    run = subprocess.Popen([sys.executable, "-m", "heldout", "-q", "run", "--task", "lockpicking/six", "--optimizer",
                            "seed", "--optimizer", "slow=slow_opt:optimize", "--trusted-optimizer", "--seeds", "0",
                            "--budget", "400", "--run-dir", str(study)], cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        give_up = time.monotonic() + 120
        ledger = study / "lockpicking__six" / "slow" / "seed-0" / "ledger.jsonl"
        while not (ledger.exists() and '"evaluation"' in ledger.read_text()):
            assert run.poll() is None and time.monotonic() < give_up, run.communicate()
            time.sleep(0.05)
        running = report_warnings(study, tmp_path / "while")
        assert "RUNNING, no record yet" in running and "holds its ledger" in running, running
        assert "interrupted" not in running
        # the leak ablation of a running study would be of its finished runs: refused, nothing written
        ablation = subprocess.run([sys.executable, "-m", "heldout", "leak", "ablate", str(study)],
                                  capture_output=True, text=True, timeout=300)
        lines = ablation.stderr.splitlines()
        assert ablation.returncode == 2 and len(lines) == 1 and "still running" in lines[0], lines[-5:]
        assert not (study / LEAK_ABLATION_DIR).exists()
    finally:
        run.send_signal(signal.SIGTERM)
        run.communicate(timeout=120)
    assert run.returncode == 130
    stopped = report_warnings(study, tmp_path / "after")
    assert "interrupted before it finished" in stopped and "RUNNING" not in stopped, stopped
