"""Helpers for tests that kill a study midway and run it again (resume, concurrent writers).

The pause (PACE seconds after each evaluation) only gives a test time to kill the run; it changes
nothing the optimizer decides. It reaches an optimizer run in-process (``--trusted-optimizer``)
only: an isolated one sees the sandbox's environment, where PACE is not set, so a test of an
isolated study must not count on it to keep the study running (stop the process instead)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from heldout.evaluators.ledger import LEDGER_FILE

REPO = Path(__file__).resolve().parents[1]

PACED_SEARCH = """
import os, time
from heldout.optimizers.geometry_search import optimize as search  # what local-search runs here

class Paced:
    def __init__(self, view):
        self._view = view
    def __getattr__(self, name):
        return getattr(self._view, name)
    def evaluate(self, *args, **kw):
        out = self._view.evaluate(*args, **kw)
        time.sleep(float(os.environ.get("PACE", "0")))
        return out

def optimize(view, seed):
    return search(Paced(view), seed)
"""


def env(pace: float) -> dict[str, str]:
    """The environment of a CLI child: this checkout's heldout first, PACE seconds per evaluation."""
    return {**os.environ, "PACE": str(pace),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def evaluations(run_dir: Path) -> int:
    """Evaluations ledgered so far under ``run_dir``, over every cell."""
    return sum(p.read_text().count('"kind": "evaluation"') for p in run_dir.rglob(LEDGER_FILE))


def start_cli(args: list[str], cwd: Path, pace: float = 0.0) -> subprocess.Popen:
    """``heldout <args>`` in its own process group (so a kill takes its sandboxes along)."""
    return subprocess.Popen([sys.executable, "-m", "heldout.cli", *args], cwd=cwd, env=env(pace),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def kill_after(proc: subprocess.Popen, run_dir: Path, evaluations_done: int) -> None:
    """SIGKILL ``proc``'s group once ``evaluations_done`` evaluations are ledgered."""
    give_up = time.monotonic() + 300
    while evaluations(run_dir) < evaluations_done:
        assert proc.poll() is None, f"the study ended before it could be killed: {proc.communicate()}"
        assert time.monotonic() < give_up, "the study made no progress"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
